"""Gemma (1): logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import gemma as gemma_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import gemma
from maxtext.models import registry
from testing import hf_reference

# Tiny, with multi-query attention (as 2B) and head_dim * heads != hidden.
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=1, head_dim=24,
    max_position_embeddings=64)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


class GemmaHuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf_config = transformers.GemmaConfig(**_HF_CONFIG)
    cls.hf_model = hf_reference.random_hf_model(
        transformers.GemmaForCausalLM, hf_config, norm_mean=0.0)
    cls.cfg = gemma.model_config_from_hf(hf_config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual((cfg.norm.offset, cfg.scale_embeddings), (1.0, True))
    self.assertEqual(cfg.mlp.activation, "gelu_tanh")
    self.assertEqual((cfg.attention.num_kv_heads, cfg.attention.head_dim),
                     (1, 24))
    self.assertTrue(cfg.tie_embeddings)

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_hidden_activation_takes_precedence(self):
    hf = {**self.hf_model.config.to_dict(), "hidden_act": "gelu",
          "hidden_activation": "gelu_pytorch_tanh"}
    self.assertEqual(gemma.model_config_from_hf(hf), self.cfg)
    with self.assertRaisesRegex(ValueError, "activation 'relu'"):
      gemma.model_config_from_hf({**hf, "hidden_activation": "relu"})


class GemmaParameterCountTest(parameterized.TestCase):

  # Published counts of google/gemma-2b and google/gemma-7b.
  @parameterized.parameters(
      ("2b", 2_506_172_416),
      ("7b", 8_537_680_896),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(gemma_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)


if __name__ == "__main__":
  absltest.main()
