"""Mistral: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import mistral as mistral_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import mistral
from maxtext.models import registry
from testing import hf_reference

# Tiny, with GQA and a sliding window (5) shorter than the sequence (16),
# so every layer's window cuts off keys.
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=64, rope_theta=10_000.0, rms_norm_eps=1e-5,
    sliding_window=5)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _hf_model(**changes):
  config = transformers.MistralConfig(**{**_HF_CONFIG, **changes})
  return config, hf_reference.random_hf_model(
      transformers.MistralForCausalLM, config, norm_mean=1.0)


class MistralHuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf_config, cls.hf_model = _hf_model()
    cls.cfg = mistral.model_config_from_hf(hf_config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual(cfg.layer_windows(), (5, 5, 5))
    self.assertEqual(cfg.rope.local_theta, cfg.rope.theta)
    self.assertFalse(cfg.tie_embeddings)

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_the_window_matters(self):
    # Guards the parity test: without the window our logits differ.
    cfg = self.cfg.replace(sliding_window=0,
                              global_layer_interval=1)
    self.assertGreater(
        hf_reference.max_logit_diff(self.hf_model, cfg, _TOKENS), 1e-2)

  def test_logits_match_without_window(self):
    # v0.2/v0.3: no window, rotary base 1M.
    hf_config, hf_model = _hf_model(sliding_window=None, rope_theta=1e6)
    cfg = mistral.model_config_from_hf(hf_config.to_dict())
    self.assertEqual(cfg.layer_windows(), (None,) * 3)
    self.assertEqual(cfg.rope.theta, 1e6)
    self.assertLessEqual(hf_reference.max_logit_diff(hf_model, cfg, _TOKENS),
                         _TOLERANCE)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_window_with_rope_scaling_is_rejected(self):
    hf = {**self.hf_model.config.to_dict(),
          "rope_parameters": dict(rope_type="linear", factor=2.0,
                                  rope_theta=1e4)}
    with self.assertRaisesRegex(ValueError, "sliding window.*linear"):
      mistral.model_config_from_hf(hf)


class MistralParameterCountTest(parameterized.TestCase):

  # 7b: the published count of mistralai/Mistral-7B-v0.1.
  # v0.3-7b: computed from the mistralai/Mistral-7B-v0.3 config (v0.1 plus
  # 768 vocabulary rows in the embedding and the head: 2 * 768 * 4096); we
  # have no exact published figure to cite (the model card says 7.25B).
  @parameterized.parameters(
      ("7b", 7_241_732_096),
      ("v0.3-7b", 7_241_732_096 + 2 * 768 * 4096),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(mistral_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)


if __name__ == "__main__":
  absltest.main()
