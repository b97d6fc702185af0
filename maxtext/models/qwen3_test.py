"""Qwen 3: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import qwen3 as qwen3_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import qwen3
from maxtext.models import registry
from testing import hf_reference

# Tiny, with GQA, q/k norms and head_dim * heads != hidden (as in Qwen 3).
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=24,
    max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-6)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _hf_model(**changes):
  config = transformers.Qwen3Config(**{**_HF_CONFIG, **changes})
  return config, hf_reference.random_hf_model(
      transformers.Qwen3ForCausalLM, config, norm_mean=1.0)


def _parameter_count(layers, embed, mlp, heads, tied, kv_heads=8,
                     head_dim=128, vocab=151_936):
  """Parameters of a Qwen 3 config, counted independently of our model."""
  attention = (embed * (heads + 2 * kv_heads) * head_dim  # q, k, v kernels.
               + heads * head_dim * embed  # Output kernel.
               + 2 * head_dim)  # q and k norms.
  block = attention + 3 * embed * mlp + 2 * embed  # MLP, two norms.
  return vocab * embed * (1 if tied else 2) + layers * block + embed


class Qwen3HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf_config, cls.hf_model = _hf_model(tie_word_embeddings=False)
    cls.cfg = qwen3.model_config_from_hf(hf_config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertTrue(cfg.attention.qk_norm)
    self.assertFalse(cfg.attention.qkv_bias)
    self.assertFalse(cfg.tie_embeddings)
    self.assertEqual((cfg.attention.head_dim, cfg.query_scale), (24, 24**-0.5))

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_logits_match_tied(self):
    hf_config, hf_model = _hf_model(tie_word_embeddings=True)
    cfg = qwen3.model_config_from_hf(hf_config.to_dict())
    self.assertTrue(cfg.tie_embeddings)
    self.assertLessEqual(hf_reference.max_logit_diff(hf_model, cfg, _TOKENS),
                         _TOLERANCE)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_attention_bias_is_rejected(self):
    hf = {**self.hf_model.config.to_dict(), "attention_bias": True}
    with self.assertRaisesRegex(ValueError, "attention_bias"):
      qwen3.model_config_from_hf(hf)


class Qwen3ParameterCountTest(parameterized.TestCase):

  # Expected counts are computed by `_parameter_count` from the Hugging Face
  # configs of Qwen/Qwen3-*-Base (vocab_size 151,936, head_dim 128,
  # num_key_value_heads 8; num_hidden_layers, hidden_size, intermediate_size,
  # num_attention_heads and tie_word_embeddings below). 8b's total equals
  # the Qwen3-8B safetensors total, 8,190,735,360; the others agree with the
  # model cards' rounded figures (0.6B, 1.7B, 4.0B, 14.8B, 32.8B), which we
  # did not check to the last digit.
  @parameterized.parameters(
      ("0.6b", _parameter_count(28, 1024, 3072, 16, True)),
      ("1.7b", _parameter_count(28, 2048, 6144, 16, True)),
      ("4b", _parameter_count(36, 2560, 9728, 32, True)),
      ("8b", _parameter_count(36, 4096, 12_288, 32, False)),
      ("14b", _parameter_count(40, 5120, 17_408, 40, False)),
      ("32b", _parameter_count(64, 5120, 25_600, 64, False)),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(qwen3_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)

  def test_count_of_8b_spelled_out(self):
    self.assertEqual(_parameter_count(36, 4096, 12_288, 32, False),
                     8_190_735_360)


if __name__ == "__main__":
  absltest.main()
