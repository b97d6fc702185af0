"""Tests of the family configs: every variant is a valid ModelConfig."""

import ast
import inspect
import sys
from unittest import mock

from absl import flags
from absl.testing import absltest
from absl.testing import parameterized

from configs import common
from configs import gemma2
from configs import gemma3
from configs import mistral
from maxtext.common.model_config import ModelConfig
from maxtext.data.data_config import DataConfig
from maxtext.models import registry
from ml_collections import config_flags

from testing import tiny_configs

_FAMILIES = tiny_configs.CONFIG_MODULES
_VARIANTS = [(family, variant) for family, module in _FAMILIES.items()
             for variant in (None, *module.VARIANTS)]


class ConfigsTest(parameterized.TestCase):

  @parameterized.parameters(*_VARIANTS)
  def test_variant_builds_a_model_config(self, family, variant):
    config = _FAMILIES[family].get_config(variant)
    cfg = ModelConfig.from_dict(config.model)
    self.assertEqual(cfg.family, family)
    self.assertEqual(list(config), list(common.base_config()))

  @parameterized.parameters(*_VARIANTS)
  def test_variant_is_a_model_of_its_family_file(self, family, variant):
    cfg = ModelConfig.from_dict(_FAMILIES[family].get_config(variant).model)
    module = registry.family_module(family)
    # The architecture is the family file's, stated there once.
    flat = cfg.to_dict()
    self.assertEqual({name: flat[name] for name in module.ARCHITECTURE},
                     module.ARCHITECTURE)
    # The family file reads the variant's Hugging Face config back as it:
    # the config holds nothing the family file does not describe.
    back = module.model_config_from_hf(module.hf_config_from_model_config(cfg))
    compute = {name: flat[name] for name in ("dtype", "param_dtype",
                                              "scan_layers")}
    self.assertEqual(back.replace(**compute), cfg)

  def test_a_config_cannot_restate_the_architecture(self):
    with self.assertRaisesRegex(
        ValueError, r"configs/gemma3.py restates \['qk_norm'\], the"
        " architecture of maxtext/models/gemma3.py"):
      common.family_config("gemma3", None,
                           {"small": gemma3.VARIANTS["small"]}, qk_norm=False)

  @parameterized.parameters(*_FAMILIES)
  def test_default_is_a_small_cpu_model(self, family):
    config = _FAMILIES[family].get_config()
    self.assertEqual(config, _FAMILIES[family].get_config("small"))
    cfg = ModelConfig.from_dict(config.model)
    self.assertEqual(cfg.vocab_size, 32_000)  # Mistral v1 tokenizer.
    self.assertEqual(cfg.dtype, "float32")
    self.assertLessEqual(cfg.embed_dim, 384)
    self.assertLessEqual(cfg.num_layers, 6)
    self.assertEqual(config.train, common.base_config().train)
    self.assertEqual(config.data, common.base_config().data)

  def test_model_defaults_are_the_dataclass_defaults(self):
    defaults = common.model_defaults()
    schema = ModelConfig.section_schema()
    self.assertEqual(sorted(defaults), sorted(schema))
    for key, default in ModelConfig.keys().items():
      if not schema[key][1]:  # Not a key the family must set.
        self.assertEqual(defaults[key], default, key)

  def test_query_scalar_overrides_from_the_command_line(self):
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=flag_values)
    argv = ["prog", f"--config={inspect.getsourcefile(gemma2)}:27b",
            "--config.model.query_pre_attn_scalar=100"]
    # The config flag reads its overrides from sys.argv, as under app.run.
    with mock.patch.object(sys, "argv", argv):
      flag_values(argv)
    cfg = ModelConfig.from_dict(flag_values.config.model)
    self.assertEqual(cfg.attention.query_pre_attn_scalar, 100.0)

  def test_gemma3_small_has_the_local_global_pattern(self):
    cfg = ModelConfig.from_dict(gemma3.get_config().model)
    self.assertEqual(cfg.layer_windows(), (128,) * 5 + (None,))

  @parameterized.parameters(*_FAMILIES)
  def test_unknown_variant_lists_valid_ones(self, family):
    with self.assertRaisesRegex(ValueError, r"'1t'.*valid variants.*small"):
      _FAMILIES[family].get_config("1t")

  def test_gemma2_alternates_local_and_global_layers(self):
    cfg = ModelConfig.from_dict(gemma2.get_config("2b").model)
    self.assertEqual(cfg.layer_windows()[:4], (4096, None, 4096, None))
    self.assertEqual(cfg.rope.local_theta, cfg.rope.theta)
    self.assertEqual((cfg.attention.logit_softcap, cfg.final_logit_softcap),
                     (50.0, 30.0))
    self.assertEqual(ModelConfig.from_dict(gemma2.get_config().model)
                     .layer_windows(), (64, None) * 3)

  def test_mistral_window_applies_to_every_layer(self):
    cfg = ModelConfig.from_dict(mistral.get_config("7b").model)
    self.assertEqual(cfg.layer_windows(), (4096,) * 32)
    self.assertEqual(cfg.rope.local_theta, cfg.rope.theta)
    cfg = ModelConfig.from_dict(mistral.get_config("v0.3-7b").model)
    self.assertEqual(cfg.layer_windows(), (None,) * 32)
    self.assertEqual((cfg.vocab_size, cfg.rope.theta), (32_768, 1e6))

  def test_mistral_local_rotary_follows_rope_theta_override(self):
    config = mistral.get_config()
    config.model.rope_theta = 1e6
    self.assertEqual(ModelConfig.from_dict(config.model).rope.local_theta, 1e6)

  @parameterized.parameters(
      ("qwen2_5", "0.5b", True), ("qwen2_5", "3b", True),
      ("qwen2_5", "7b", False), ("qwen2_5", "72b", False),
      ("qwen3", "0.6b", True), ("qwen3", "4b", True), ("qwen3", "8b", False),
      ("qwen3", "32b", False))
  def test_qwen_ties_embeddings_of_small_variants(self, family, variant,
                                                  tied):
    cfg = ModelConfig.from_dict(_FAMILIES[family].get_config(variant).model)
    self.assertEqual(cfg.tie_embeddings, tied)
    self.assertEqual(cfg.attention.qkv_bias, family == "qwen2_5")
    self.assertEqual(cfg.attention.qk_norm, family == "qwen3")

  @parameterized.parameters(*(_FAMILIES[family] for family in (
      "llama2", "llama3", "mistral", "gemma", "qwen2_5", "qwen3")))
  def test_query_scale_follows_head_dim_override(self, module):
    config = module.get_config()
    config.model.head_dim = 32
    cfg = ModelConfig.from_dict(config.model)
    self.assertEqual(cfg.query_scale, 32**-0.5)

  @parameterized.parameters(*_FAMILIES.values())
  def test_configs_import_only_ml_collections_and_common(self, module):
    imports = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
      if isinstance(node, ast.Import):
        imports.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        imports.update(f"{node.module}.{alias.name}" for alias in node.names)
    self.assertEqual(imports, {"ml_collections", "configs.common"})

  def test_data_section_builds_and_takes_a_mixture(self):
    config = gemma3.get_config()
    data = DataConfig(**config.data.to_dict())
    self.assertEqual((data.source, data.packing), ("text", "concat"))
    config.data.source = "mixture"
    config.data.mixture = {
        "web": {"source": "jsonl", "files": "/d/web/*.jsonl", "weight": 3.0},
        "code": {"source": "parquet", "files": "/d/code/*", "weight": 1.0,
                 "text_field": "content"}}
    data = DataConfig(**config.data.to_dict())
    self.assertEqual([(name, c.source, c.weight, c.text_field)
                      for name, c in data.components()],
                     [("code", "parquet", 1.0, "content"),
                      ("web", "jsonl", 3.0, "")])


if __name__ == "__main__":
  absltest.main()
