"""Tests of the family configs: every variant is a valid ModelConfig."""

import ast
import inspect

from absl.testing import absltest
from absl.testing import parameterized

from configs import common
from configs import gemma3
from configs import llama3
from maxtext.common.model_config import ModelConfig

_FAMILIES = {"gemma3": gemma3, "llama3": llama3}
_VARIANTS = [(family, variant) for family, module in _FAMILIES.items()
             for variant in (None, *module.VARIANTS)]


class ConfigsTest(parameterized.TestCase):

  @parameterized.parameters(*_VARIANTS)
  def test_variant_builds_a_model_config(self, family, variant):
    config = _FAMILIES[family].get_config(variant)
    cfg = ModelConfig.from_dict(config.model)
    self.assertEqual(cfg.family, family)
    self.assertEqual(list(config), list(common.base_config()))

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

  def test_gemma3_small_has_the_local_global_pattern(self):
    cfg = ModelConfig.from_dict(gemma3.get_config().model)
    self.assertEqual(cfg.layer_windows(), (128,) * 5 + (None,))

  @parameterized.parameters(*_FAMILIES)
  def test_unknown_variant_lists_valid_ones(self, family):
    with self.assertRaisesRegex(ValueError, r"'7b'.*valid variants.*small"):
      _FAMILIES[family].get_config("7b")

  def test_llama_query_scale_follows_head_dim_override(self):
    config = llama3.get_config()
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


if __name__ == "__main__":
  absltest.main()
