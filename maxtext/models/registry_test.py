"""Tests of the model registry."""

import re

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from maxtext.common.model_config import ModelConfig
from maxtext.models import registry

_SIZES = dict(vocab_size=16, num_layers=1, embed_dim=8, mlp_dim=8,
              num_heads=2, num_kv_heads=1, head_dim=4)


class RegistryTest(parameterized.TestCase):

  @parameterized.parameters(*registry.FAMILIES)
  def test_family_exposes_the_interface(self, family):
    module = registry.family_module(family)
    for name in ("MODEL_CLASS", "model_config_from_hf", "HF_PARAMS"):
      self.assertTrue(hasattr(module, name), msg=f"{family}.{name}")
    self.assertTrue(hasattr(module, "HF_BLOCK_PARAMS") or
                    hasattr(module, "hf_block_params"), msg=family)
    model = registry.create_model(ModelConfig.from_dict(dict(family=family,
                                                             **_SIZES)),
                                  rngs=nnx.Rngs(0))
    self.assertIsInstance(model, module.MODEL_CLASS)

  def test_unknown_family_lists_valid_ones(self):
    cfg = ModelConfig.from_dict(dict(family="gpt9", **_SIZES))
    with self.assertRaisesRegex(
        ValueError, r"'gpt9'.*" + re.escape(str(sorted(registry.FAMILIES)))):
      registry.create_model(cfg, rngs=nnx.Rngs(0))


if __name__ == "__main__":
  absltest.main()
