"""Llama 3: logits equal Hugging Face's; config mapping; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import llama3 as llama3_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import llama3
from maxtext.models import registry
from testing import hf_reference

# Tiny, with GQA and llama3 rope scaling whose original context (8) is
# shorter than the test sequence (16), so all three frequency bands occur.
_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=8)
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=64, rope_theta=10_000.0, rms_norm_eps=1e-5,
    rope_scaling=_LLAMA3_ROPE)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _hf_model(**changes):
  config = transformers.LlamaConfig(**{**_HF_CONFIG, **changes})
  return config, hf_reference.random_hf_model(
      transformers.LlamaForCausalLM, config, norm_mean=1.0)


class Llama3HuggingFaceTest(parameterized.TestCase):

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    hf_config, hf_model = _hf_model(tie_word_embeddings=False)
    cfg = llama3.model_config_from_hf(hf_config.to_dict())
    self.assertEqual(cfg.rope.scaling, "llama3")
    self.assertFalse(cfg.tie_embeddings)
    diff = hf_reference.max_logit_diff(hf_model, cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(
      dict(rope_type="linear", factor=4.0),
      dict(rope_type="default"),
  )
  def test_logits_match_tied_with_other_rope(self, **rope_scaling):
    hf_config, hf_model = _hf_model(tie_word_embeddings=True,
                                    rope_scaling=rope_scaling)
    cfg = llama3.model_config_from_hf(hf_config.to_dict())
    self.assertTrue(cfg.tie_embeddings)
    self.assertEqual(cfg.rope.scaling, rope_scaling["rope_type"])
    self.assertLessEqual(
        hf_reference.max_logit_diff(hf_model, cfg, _TOKENS), _TOLERANCE)

  def test_legacy_config_json_keys(self):
    hf_config, _ = _hf_model()
    legacy = {k: v for k, v in hf_config.to_dict().items()
              if k != "rope_parameters"}
    legacy.update(rope_theta=10_000.0, rope_scaling=_LLAMA3_ROPE)
    self.assertEqual(llama3.model_config_from_hf(legacy),
                     llama3.model_config_from_hf(hf_config.to_dict()))

  def test_unsupported_features_are_rejected(self):
    hf_config, _ = _hf_model()
    with self.assertRaisesRegex(ValueError, "attention_bias"):
      llama3.model_config_from_hf({**hf_config.to_dict(),
                                   "attention_bias": True})
    with self.assertRaisesRegex(ValueError, "rope_type 'longrope'"):
      llama3.model_config_from_hf({
          **hf_config.to_dict(),
          "rope_parameters": dict(rope_type="longrope", rope_theta=1e4)})


class Llama3ParameterCountTest(parameterized.TestCase):

  # Published counts of the Hugging Face checkpoints meta-llama/
  # Meta-Llama-3-8B, Meta-Llama-3-70B, Llama-3.1-405B, Llama-3.2-1B and
  # Llama-3.2-3B (safetensors total_size / 2 bytes; 3.1 sizes equal 3).
  @parameterized.parameters(
      ("8b", 8_030_261_248),
      ("3.1-8b", 8_030_261_248),
      ("70b", 70_553_706_496),
      ("3.1-70b", 70_553_706_496),
      ("405b", 405_853_388_800),
      ("3.1-405b", 405_853_388_800),
      ("3.2-1b", 1_235_814_400),
      ("3.2-3b", 3_212_749_824),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(llama3_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)


if __name__ == "__main__":
  absltest.main()
