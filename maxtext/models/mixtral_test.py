"""Mixtral: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import mixtral as mixtral_config
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import mixtral
from maxtext.models import registry
from testing import hf_reference

_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    rope_theta=1e6, rms_norm_eps=1e-5)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _parameter_counts(layers, embed, mlp, heads, vocab, kv_heads=8,
                      head_dim=128, experts=8, per_token=2):
  """(total, active) parameters of a Mixtral config, counted by hand."""
  attention = embed * (2 * heads + 2 * kv_heads) * head_dim
  expert = 3 * embed * mlp
  rest = attention + embed * experts + 2 * embed  # Router, two norms.
  other = 2 * vocab * embed + embed  # Embedding, head, final norm.
  return (other + layers * (rest + experts * expert),
          other + layers * (rest + per_token * expert))


class MixtralHuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = transformers.MixtralConfig(**_HF_CONFIG)
    cls.hf_model = hf_reference.random_hf_model(
        transformers.MixtralForCausalLM, config, norm_mean=1.0)
    cls.cfg = mixtral.model_config_from_hf(config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual((cfg.moe.num_experts, cfg.moe.num_experts_per_token,
                      cfg.moe.mlp_dim), (4, 2, 32))
    self.assertTrue(cfg.moe.router_normalize)
    self.assertEqual(cfg.moe.router_score, "softmax")
    self.assertEqual(mixtral.model_config_from_hf(
        mixtral.hf_config_from_model_config(cfg)), cfg)

  # capacity_factor 2 = experts / per token: no token is ever dropped.
  @parameterized.parameters((True, "dropless"), (False, "dropless"),
                            (True, "capacity"), (True, "dense"))
  def test_logits_match(self, scan_layers, moe_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       moe_impl=moe_impl, capacity_factor=2.0)
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_sliding_window_is_rejected(self):
    hf = {**self.hf_model.config.to_dict(), "sliding_window": 4096}
    with self.assertRaisesRegex(ValueError, "sliding_window"):
      mixtral.model_config_from_hf(hf)


class MixtralParameterCountTest(parameterized.TestCase):

  # 8x7b: 46,702,792,704 total (the safetensors total of
  # mistralai/Mixtral-8x7B-v0.1) and 12,879,925,248 active; 8x22b: the
  # model card's 141B total, 39B active.
  @parameterized.parameters(
      ("8x7b", _parameter_counts(32, 4096, 14_336, 32, 32_000)),
      ("8x22b", _parameter_counts(56, 6144, 16_384, 48, 32_768)),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(mixtral_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    total, active = expected
    self.assertEqual(count, total)
    # The FLOP counter's matmul parameters: the active ones without the
    # embedding lookup and the norm scales.
    norms = (2 * cfg.num_layers + 1) * cfg.embed_dim
    self.assertEqual(flops.matmul_params(cfg),
                     active - cfg.vocab_size * cfg.embed_dim - norms)

  def test_published_figures(self):
    self.assertEqual(_parameter_counts(32, 4096, 14_336, 32, 32_000),
                     (46_702_792_704, 12_879_925_248))
    total, active = _parameter_counts(56, 6144, 16_384, 48, 32_768)
    self.assertEqual((round(total / 1e9), round(active / 1e9)), (141, 39))


if __name__ == "__main__":
  absltest.main()
