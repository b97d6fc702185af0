"""Qwen 3 MoE: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import qwen3_moe as qwen3_moe_config
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import qwen3_moe
from maxtext.models import registry
from testing import hf_reference

# Tiny, with GQA, q/k norms and head_dim * heads != hidden (as in Qwen 3).
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96,
    moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=24, num_experts=8, num_experts_per_tok=3,
    max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-6)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _parameter_counts(layers, embed, expert_mlp, heads, kv_heads=4,
                      head_dim=128, experts=128, per_token=8,
                      vocab=151_936):
  """(total, active) parameters of a Qwen 3 MoE config, counted by hand."""
  attention = (embed * (2 * heads + 2 * kv_heads) * head_dim
               + 2 * head_dim)  # q and k norms.
  expert = 3 * embed * expert_mlp
  rest = attention + embed * experts + 2 * embed  # Router, two norms.
  other = 2 * vocab * embed + embed  # Embedding, head, final norm.
  return (other + layers * (rest + experts * expert),
          other + layers * (rest + per_token * expert))


class Qwen3MoeHuggingFaceTest(parameterized.TestCase):

  @parameterized.parameters((True, True, "dropless"),
                            (True, False, "dropless"),
                            (False, True, "dropless"),
                            (True, True, "capacity"))
  def test_logits_match(self, normalize, scan_layers, moe_impl):
    config = transformers.Qwen3MoeConfig(**_HF_CONFIG,
                                         norm_topk_prob=normalize)
    hf_model = hf_reference.random_hf_model(
        transformers.Qwen3MoeForCausalLM, config, norm_mean=1.0)
    cfg = qwen3_moe.model_config_from_hf(config.to_dict())
    self.assertEqual(cfg.moe.router_normalize, normalize)
    # capacity_factor 8/3: every expert can take every token.
    diff = hf_reference.max_logit_diff(hf_model, cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       moe_impl=moe_impl,
                                       capacity_factor=8 / 3)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_config_and_weights_round_trip(self):
    config = transformers.Qwen3MoeConfig(**_HF_CONFIG, norm_topk_prob=True)
    hf_model = hf_reference.random_hf_model(
        transformers.Qwen3MoeForCausalLM, config, norm_mean=1.0)
    cfg = qwen3_moe.model_config_from_hf(config.to_dict())
    self.assertEqual((cfg.moe.num_experts, cfg.moe.num_experts_per_token,
                      cfg.moe.mlp_dim, cfg.mlp.dim), (8, 3, 32, 96))
    self.assertEqual(qwen3_moe.model_config_from_hf(
        qwen3_moe.hf_config_from_model_config(cfg)), cfg)
    for scan_layers in (True, False):
      hf_reference.assert_round_trip(hf_model, cfg, scan_layers=scan_layers)

  def test_dense_layers_are_rejected(self):
    hf = {**transformers.Qwen3MoeConfig(**_HF_CONFIG).to_dict(),
          "mlp_only_layers": [0]}
    with self.assertRaisesRegex(ValueError, "mlp_only_layers"):
      qwen3_moe.model_config_from_hf(hf)


class Qwen3MoeParameterCountTest(parameterized.TestCase):

  # Model cards: Qwen3-30B-A3B 30.5B total, 3.3B activated; Qwen3-235B-A22B
  # 235B total, 22B activated (truncated to those digits).
  @parameterized.parameters(
      ("30b-a3b", _parameter_counts(48, 2048, 768, 32), (30.5, 3.3), 1),
      ("235b-a22b", _parameter_counts(94, 4096, 1536, 64), (235, 22), 0),
  )
  def test_published_variant(self, variant, expected, published, digits):
    cfg = ModelConfig.from_dict(qwen3_moe_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    total, active = expected
    self.assertEqual(count, total)
    self.assertEqual(
        tuple(math.floor(n / 1e9 * 10**digits) / 10**digits
              for n in (total, active)), published)
    # The FLOP counter's matmul parameters: the active ones without the
    # embedding lookup and the norm scales.
    norms = (2 * cfg.num_layers + 1) * cfg.embed_dim + cfg.num_layers * 256
    self.assertEqual(flops.matmul_params(cfg),
                     active - cfg.vocab_size * cfg.embed_dim - norms)


if __name__ == "__main__":
  absltest.main()
