"""Tests the post-training configs: every variant of configs/sft.py,
sft_vlm.py, dpo.py and distill.py builds, and bad keys and values are
named."""

from absl.testing import absltest
from absl.testing import parameterized

from configs import distill as distill_config
from configs import dpo as dpo_config
from configs import sft as sft_config
from configs import sft_vlm as sft_vlm_config
from maxtext.posttrain import lora
from maxtext.posttrain import config as config_lib
from maxtext.posttrain.config import PosttrainConfig
from testing import config_checks

_VARIANTS = ([(sft_config, v) for v in sft_config.VARIANTS] +
             [(sft_vlm_config, v) for v in sft_vlm_config.VARIANTS] +
             [(dpo_config, v) for v in dpo_config.VARIANTS] +
             [(distill_config, None)])


def _loadable(module, variant):
  config = module.get_config(variant)
  config.train.load = "ckpt"
  config.data.files = "data.jsonl"
  config.data.eval_files = "eval.jsonl"  # The smollm2 demo evaluates.
  # The user names the checkpoint's own template (sft_vlm.py:llama4).
  config.data.chat_template = config.data.chat_template or "llama3"
  if "distill" in config:
    config.distill.teacher = "teacher"
  return config


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(*_VARIANTS)
  def test_variant_builds(self, module, variant):
    built = PosttrainConfig.from_config_dict(_loadable(module, variant))
    method = built.train.method
    self.assertEqual(built.sft is not None, method in ("sft", "distill"))
    self.assertEqual(built.dpo is not None, method in ("dpo", "orpo"))
    self.assertEqual(built.distill is not None, method == "distill")
    if variant in ("lora", "qlora", "smollm2", "gemma3_lora", "gemma3_qlora",
                   "llama4_lora"):
      self.assertEqual(built.lora.mode, "qlora" if "qlora" in variant else
                       "lora")

  @parameterized.parameters((sft_config, "lora"), (distill_config, None))
  def test_floats_refuse_nan_and_inf_and_paths_resolve(self, module,
                                                       variant):
    config = _loadable(module, variant)
    method = config.train.method
    config_checks.assert_front_door(
        self, PosttrainConfig.from_config_dict, config,
        {**config_lib.COMMON_SECTIONS, **config_lib.METHOD_SECTIONS[method]})

  def test_default_module_path_is_the_libraries(self):
    self.assertEqual(sft_config.get_config().lora.module_path,
                     lora.DEFAULT_MODULE_PATH)

  def test_bad_keys_and_values_are_named(self):
    config = _loadable(sft_config, "lora")
    config.lora.rnak = 4
    with self.assertRaisesRegex(ValueError,
                                "'lora.rnak'.*did you mean 'lora.rank'"):
      PosttrainConfig.from_config_dict(config)
    config = _loadable(dpo_config, "dpo")
    config.dpo.reference = "policy"
    with self.assertRaisesRegex(ValueError,
                                "dpo.reference='policy'.*'initial'"):
      PosttrainConfig.from_config_dict(config)
    config = _loadable(dpo_config, "dpo")
    config.train.method = "sft"
    with self.assertRaisesRegex(
        ValueError, r"missing config section\(s\) \['sft'\]"):
      PosttrainConfig.from_config_dict(config)
    config = _loadable(distill_config, None)
    config.distill.feature_layers = ((1,),)
    with self.assertRaisesRegex(ValueError, "must be pairs"):
      PosttrainConfig.from_config_dict(config)
    config = _loadable(distill_config, None)
    config.data.images_per_row = 1
    with self.assertRaisesRegex(ValueError, "images_per_row=1: train.method="
                                "'distill' reads no images"):
      PosttrainConfig.from_config_dict(config)
    config = _loadable(sft_config, None)
    config.train.microbatches = 3
    with self.assertRaisesRegex(ValueError, "microbatches=3 must divide"):
      PosttrainConfig.from_config_dict(config)
    config = _loadable(dpo_config, "orpo")
    config.train.compiled = "/tmp/step.zip"
    with self.assertRaisesRegex(
        ValueError, "train.compiled='/tmp/step.zip': only 'sft' trains with a"
        " step compiled ahead of time, not train.method='orpo'"):
      PosttrainConfig.from_config_dict(config)

  def test_unknown_variant_lists_valid_ones(self):
    with self.assertRaisesRegex(ValueError, "'dora'.*valid variants"):
      sft_config.get_config("dora")


if __name__ == "__main__":
  absltest.main()
