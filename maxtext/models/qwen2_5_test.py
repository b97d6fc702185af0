"""Qwen 2.5: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import qwen2_5 as qwen2_5_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import qwen2_5
from maxtext.models import registry
from testing import hf_reference

# Tiny, with GQA and q/k/v biases (random, like every other parameter).
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    rope_theta=1e6, rms_norm_eps=1e-6)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _hf_model(**changes):
  config = transformers.Qwen2Config(**{**_HF_CONFIG, **changes})
  return config, hf_reference.random_hf_model(
      transformers.Qwen2ForCausalLM, config, norm_mean=1.0)


def _parameter_count(vocab, layers, embed, mlp, heads, kv_heads, tied,
                     head_dim=128):
  """Parameters of a Qwen 2.5 config, counted independently of our model."""
  attention = (embed * (heads + 2 * kv_heads) * head_dim  # q, k, v kernels.
               + (heads + 2 * kv_heads) * head_dim  # q, k, v biases.
               + heads * head_dim * embed)  # Output kernel.
  block = attention + 3 * embed * mlp + 2 * embed  # MLP, two norms.
  return vocab * embed * (1 if tied else 2) + layers * block + embed


class Qwen25HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf_config, cls.hf_model = _hf_model(tie_word_embeddings=True)
    cls.cfg = qwen2_5.model_config_from_hf(hf_config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertTrue(cfg.attention.qkv_bias)
    self.assertTrue(cfg.tie_embeddings)
    self.assertEqual((cfg.attention.head_dim, cfg.rope.theta), (16, 1e6))

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_logits_match_untied(self):
    hf_config, hf_model = _hf_model(tie_word_embeddings=False)
    cfg = qwen2_5.model_config_from_hf(hf_config.to_dict())
    self.assertFalse(cfg.tie_embeddings)
    self.assertLessEqual(hf_reference.max_logit_diff(hf_model, cfg, _TOKENS),
                         _TOLERANCE)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_sliding_window_is_rejected(self):
    hf = {**self.hf_model.config.to_dict(), "use_sliding_window": True}
    with self.assertRaisesRegex(ValueError, "use_sliding_window"):
      qwen2_5.model_config_from_hf(hf)


class Qwen25ParameterCountTest(parameterized.TestCase):

  # Expected counts are computed by `_parameter_count` from the Hugging Face
  # configs of Qwen/Qwen2.5-* (vocab_size, num_hidden_layers, hidden_size,
  # intermediate_size, num_attention_heads, num_key_value_heads,
  # tie_word_embeddings; head_dim = hidden_size / num_attention_heads). They
  # agree with the model cards' rounded figures (0.49B, 1.54B, 3.09B, 7.61B,
  # 14.7B, 32.5B, 72.7B).
  @parameterized.parameters(
      ("0.5b", _parameter_count(151_936, 24, 896, 4864, 14, 2, True, 64)),
      ("1.5b", _parameter_count(151_936, 28, 1536, 8960, 12, 2, True)),
      ("3b", _parameter_count(151_936, 36, 2048, 11_008, 16, 2, True)),
      ("7b", _parameter_count(152_064, 28, 3584, 18_944, 28, 4, False)),
      ("14b", _parameter_count(152_064, 48, 5120, 13_824, 40, 8, False)),
      ("32b", _parameter_count(152_064, 64, 5120, 27_648, 40, 8, False)),
      ("72b", _parameter_count(152_064, 80, 8192, 29_568, 64, 8, False)),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(qwen2_5_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)

  def test_counts_of_two_variants_spelled_out(self):
    # Guards `_parameter_count` with two totals written out.
    self.assertEqual(_parameter_count(151_936, 24, 896, 4864, 14, 2, True, 64),
                     494_032_768)
    self.assertEqual(_parameter_count(152_064, 28, 3584, 18_944, 28, 4, False),
                     7_615_616_512)


if __name__ == "__main__":
  absltest.main()
