"""Tests the RL config's front door: configs/grpo.py's variants build, floats
refuse NaN and infinities, and the user's paths resolve."""

from absl.testing import absltest
from absl.testing import parameterized

from configs import grpo as grpo_config
from maxtext.rl import config as config_lib
from testing import config_checks


class RlConfigTest(parameterized.TestCase):

  @parameterized.parameters(*grpo_config.VARIANTS)
  def test_variant_builds(self, variant):
    config = grpo_config.get_config(variant)
    if config.data.source != config_lib.TOY_SOURCE:  # smollm2: GSM8K.
      config.train.load = "ckpt"
      config.data.files = "gsm8k.jsonl"
    built = config_lib.RlRunConfig.from_config_dict(config)
    self.assertEqual(built.model is None, bool(config.train.load))

  def test_floats_refuse_nan_and_inf_and_paths_resolve(self):
    config = grpo_config.get_config("smollm2")
    config.train.load = "ckpt"
    config.data.files = "gsm8k.jsonl"
    config_checks.assert_front_door(
        self, config_lib.RlRunConfig.from_config_dict, config,
        config_lib.SECTIONS)

  def test_an_unknown_section_is_named_with_the_closest(self):
    config = grpo_config.get_config()
    config.rollouts = config.rollout
    del config["rollout"]
    with self.assertRaisesRegex(
        ValueError, r"Unknown config section\(s\) \['rollouts'\] \(did you"
        r" mean 'rollout'\?\); missing config section\(s\) \['rollout'\]"):
      config_lib.RlRunConfig.from_config_dict(config)


if __name__ == "__main__":
  absltest.main()
