"""DeepSeek-V2: logits and weights equal Hugging Face's (V2's group-limited
routing, V2-Lite's greedy routing, with and without low-rank queries); what
each routing feature does; published parameter counts.

Greedy generation against transformers' is in
`maxtext/inference/hf_generate_test.py` (every family of
`testing/hf_tiny_models.py`).
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch

from configs import deepseek2 as deepseek2_config
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import deepseek2
from maxtext.models import hf_weights
from maxtext.models import registry
from testing import hf_reference
from testing import hf_tiny_models

_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4
# Changes from the tiny model (V2's group-limited routing, no low-rank
# queries) to the other published shapes.
_VARIANTS = {
    "group_limited": {},
    # V2-Lite: plain top-k over all experts (its n_group is ignored).
    "greedy": dict(topk_method="greedy"),
    # DeepSeek-V2 (236B): low-rank queries.
    "low_rank_queries": dict(q_lora_rank=24),
}


def _hf_model(variant: str) -> torch.nn.Module:
  return hf_tiny_models.tiny_hf_model("deepseek2", **_VARIANTS[variant])


class DeepSeek2HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_models = {variant: _hf_model(variant) for variant in _VARIANTS}
    cls.cfgs = {variant: deepseek2.model_config_from_hf(
        model.config.to_dict()) for variant, model in cls.hf_models.items()}

  def test_config_mapping(self):
    cfg = self.cfgs["group_limited"]
    self.assertEqual(
        (cfg.attention.type, cfg.mla.q_lora_rank, cfg.mla.kv_lora_rank,
         cfg.mla.qk_nope_head_dim, cfg.attention.head_dim, cfg.mla.v_head_dim),
        ("mla", 0, 16, 12, 8, 10))
    moe = cfg.moe
    self.assertEqual(
        (moe.router_score, moe.router_bias, moe.router_normalize,
         moe.num_experts, moe.num_experts_per_token, moe.num_shared_experts,
         moe.num_expert_groups, moe.expert_groups_per_token,
         moe.expert_group_score, moe.routed_scaling_factor),
        ("softmax", False, False, 8, 3, 2, 4, 2, "max", 2.5))
    self.assertEqual((cfg.pattern.first_dense_layers, cfg.mtp.layers), (1, 0))
    self.assertTrue(cfg.mla.rope_interleave)
    greedy = self.cfgs["greedy"].moe
    self.assertEqual((greedy.num_expert_groups,
                      greedy.expert_groups_per_token), (1, 1))
    self.assertEqual(self.cfgs["low_rank_queries"].mla.q_lora_rank, 24)
    for cfg in self.cfgs.values():
      self.assertEqual(deepseek2.model_config_from_hf(
          deepseek2.hf_config_from_model_config(cfg)), cfg)

  # The xla kernel pads the 10-wide values to the 20-wide query-key heads.
  @parameterized.product(variant=tuple(_VARIANTS), scan_layers=(True, False))
  def test_logits_match(self, variant, scan_layers):
    diff = hf_reference.max_logit_diff(
        self.hf_models[variant], self.cfgs[variant], _TOKENS,
        scan_layers=scan_layers, attention_impl="reference")
    self.assertLessEqual(diff, _TOLERANCE)

  def test_logits_match_with_the_xla_kernel(self):
    diff = hf_reference.max_logit_diff(
        self.hf_models["group_limited"], self.cfgs["group_limited"], _TOKENS,
        attention_impl="xla")
    self.assertLessEqual(diff, _TOLERANCE)

  def test_bfloat16_compute_stays_close(self):
    """bfloat16 activations (float32 parameters): within 3% of the largest
    logit of transformers' float32 model."""
    hf_model = self.hf_models["group_limited"]
    with torch.no_grad():
      want = hf_model(torch.tensor(_TOKENS)).logits.numpy()
    got = self._logits(self.cfgs["group_limited"].replace(dtype="bfloat16"))
    diff = float(np.abs(np.asarray(got, np.float32) - want).max())
    print(f"deepseek2 bfloat16: max |logit diff| = {diff:.3g} (max |logit| "
          f"{np.abs(want).max():.3g})")
    self.assertLessEqual(diff, 0.03 * np.abs(want).max())

  def _logits(self, cfg):
    model = hf_weights.model_from_hf_weights(
        cfg, hf_reference.state_dict(self.hf_models["group_limited"]))
    return nnx.jit(lambda m, t: m(t))(model, jnp.asarray(_TOKENS))

  def test_each_routing_feature_changes_the_logits(self):
    """Without it the logits differ, so the match above tests it."""
    cfg = self.cfgs["group_limited"]
    want = self._logits(cfg)
    for feature, changes in (
        ("a group scores its best expert", dict(
            expert_group_score="top2_sum")),
        ("group-limited routing", dict(num_expert_groups=1,
                                       expert_groups_per_token=1)),
        ("unnormalised weights", dict(router_normalize=True)),
        ("routed_scaling_factor", dict(routed_scaling_factor=1.0)),
        ("softmax scores", dict(router_score="sigmoid"))):
      got = self._logits(cfg.replace(**changes))
      self.assertGreater(float(jnp.abs(got - want).max()), 1e-3, feature)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    for variant in ("group_limited", "low_rank_queries"):
      hf_reference.assert_round_trip(self.hf_models[variant],
                                     self.cfgs[variant],
                                     scan_layers=scan_layers)

  def test_unsupported_settings_are_named(self):
    base = self.hf_models["group_limited"].config.to_dict()
    for changes, pattern in (
        (dict(scoring_func="sigmoid"), "scoring_func='sigmoid'"),
        (dict(topk_method="noaux_tc"), "topk_method='noaux_tc'.*greedy"),
        (dict(moe_layer_freq=2), "moe_layer_freq=2"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
        (dict(num_key_value_heads=2), "num_key_value_heads=2"),
        (dict(attention_bias=True), "attention_bias")):
      with self.subTest(pattern), self.assertRaisesRegex(ValueError, pattern):
        deepseek2.model_config_from_hf({**base, **changes})

  def test_published_config_json_is_read(self):
    """DeepSeek-V2-Lite's config.json as published (legacy rope_scaling,
    DeepSeek's own keys) maps onto the `lite` variant."""
    published = dict(
        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
        vocab_size=102_400, hidden_size=2048, intermediate_size=10_944,
        moe_intermediate_size=1408, num_hidden_layers=27,
        num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
        n_routed_experts=64, routed_scaling_factor=1.0, kv_lora_rank=512,
        q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128,
        qk_nope_head_dim=128, topk_method="greedy", n_group=1, topk_group=1,
        num_experts_per_tok=6, moe_layer_freq=1, first_k_dense_replace=1,
        norm_topk_prob=False, scoring_func="softmax", aux_loss_alpha=0.001,
        seq_aux=True, hidden_act="silu", max_position_embeddings=163_840,
        rms_norm_eps=1e-6, rope_theta=10_000, tie_word_embeddings=False,
        attention_bias=False, rope_scaling=dict(
            type="yarn", factor=40, original_max_position_embeddings=4096,
            beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707))
    cfg = deepseek2.model_config_from_hf(published)
    lite = ModelConfig.from_dict(deepseek2_config.get_config("lite").model)
    self.assertEqual(cfg.replace(dtype=lite.dtype), lite)


def _count(cfg: ModelConfig) -> int:
  model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                       rngs=nnx.Rngs(0)))
  return sum(math.prod(leaf.shape)
             for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))


class DeepSeek2ParameterCountTest(parameterized.TestCase):

  # Published: DeepSeek-V2 236B total, 21B activated; V2-Lite 15.7B, 2.4B.
  # The totals to their published digits; the activated counts within the
  # published figure's last digit (V2-Lite's 2.4B is 2.46B cut short).
  @parameterized.parameters(("236b", 236, 21, 0, 0.5),
                            ("lite", 15.7, 2.4, 1, 0.1))
  def test_total_and_activated(self, variant, total_b, active_b, digits,
                               delta):
    cfg = ModelConfig.from_dict(deepseek2_config.get_config(variant).model)
    total = _count(cfg)
    # Activated: all but the idle routed experts and the embedding lookup.
    moe_layers = cfg.num_layers - cfg.pattern.first_dense_layers
    idle = cfg.moe.num_experts - cfg.moe.num_experts_per_token
    active = (total - moe_layers * idle * 3 * cfg.embed_dim * cfg.moe.mlp_dim
              - cfg.vocab_size * cfg.embed_dim)
    self.assertEqual(round(total / 1e9, digits), total_b)
    self.assertAlmostEqual(active / 1e9, active_b, delta=delta)
    # The FLOP counter's matmul parameters: the activated ones without the
    # norm scales (each layer's two, the latent norm, V2's query norm).
    norms = (cfg.num_layers * (2 * cfg.embed_dim + cfg.mla.kv_lora_rank
                               + cfg.mla.q_lora_rank) + cfg.embed_dim)
    self.assertEqual(flops.matmul_params(cfg), active - norms)


if __name__ == "__main__":
  absltest.main()
