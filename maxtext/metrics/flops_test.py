"""Tests for maxtext.metrics.flops against hand counts."""

import dataclasses

from absl.testing import absltest
from flax import nnx
import jax
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import registry


def _tiny(**overrides) -> ModelConfig:
  values = dict(family="gemma3", vocab_size=10, num_layers=2, embed_dim=4,
                mlp_dim=8, num_heads=2, num_kv_heads=1, head_dim=2,
                sliding_window=2, global_layer_interval=2)
  values.update(overrides)
  return ModelConfig.from_dict(values)


class FlopsTest(absltest.TestCase):

  def test_hand_count(self):
    cfg = _tiny()  # Layer 0 local (window 2), layer 1 global.
    # Per layer: query 4*2*2 + key 4*1*2 + value 4*1*2 + output 2*2*4 = 48,
    # MLP 3*4*8 = 96; two layers = 288; head 4*10 = 40.
    self.assertEqual(flops.matmul_params(cfg), 328)
    # seq_len 4: the global layer attends 1, 2, 3, 4 keys (mean 2.5), the
    # window-2 layer 1, 2, 2, 2 (mean 1.75); 12 * H * K = 48 per key.
    self.assertAlmostEqual(flops.attention_flops_per_token(cfg, 4),
                           48 * (2.5 + 1.75))
    self.assertAlmostEqual(flops.training_flops_per_token(cfg, 4),
                           6 * 328 + 48 * 4.25)

  def test_sparse_attention_hand_count(self):
    """One DeepSeek Sparse Attention layer: D 4, H 2, rotary K 2, query
    latent Q 3, latent Z 5, indexer I 3 heads of J 4, top 2, length 4."""
    cfg = ModelConfig.from_dict(dict(
        family="deepseek3_2", attention_type="mla", router_score="sigmoid",
        router_bias=True, mlp_activation="silu", vocab_size=10,
        num_layers=1, embed_dim=4, mlp_dim=8, num_heads=2, num_kv_heads=2,
        head_dim=2, q_lora_rank=3, kv_lora_rank=5, qk_nope_head_dim=2,
        v_head_dim=2, index_topk=2, index_num_heads=3, index_head_dim=4))
    # Indexer, trained: projections 3*3*4 + 4*(4 + 3) = 64, scores
    # 3*(4 + 1) per causal key (mean 2.5). Attention over 1, 2, 2, 2
    # selected tokens (mean 1.75): 6 * 2 * (2*5 + 2) per token.
    self.assertAlmostEqual(flops.attention_flops_per_token(cfg, 4),
                           6 * (64 + 15 * 2.5) + 6 * 2 * 12 * 1.75)
    # Dense warm-up: attention over every causal key, forward only, and
    # the frozen model's matmuls forward only.
    warmup = dataclasses.replace(cfg, mla=dataclasses.replace(
        cfg.mla, index_stage="warmup"))
    self.assertAlmostEqual(flops.attention_flops_per_token(warmup, 4),
                           6 * (64 + 15 * 2.5) + 2 * 2 * 12 * 2.5)
    self.assertAlmostEqual(
        flops.training_flops_per_token(warmup, 4),
        2 * flops.matmul_params(cfg) + 6 * (64 + 15 * 2.5) + 2 * 2 * 12 * 2.5)

  def test_mean_attended_keys_matches_a_mask_count(self):
    for seq_len in (1, 5, 16):
      for window in (None, 1, 3, 16, 40):
        i = np.arange(seq_len)[:, None]
        j = np.arange(seq_len)[None, :]
        mask = j <= i
        if window is not None:
          mask &= j > i - window
        self.assertAlmostEqual(flops.mean_attended_keys(window, seq_len),
                               mask.sum() / seq_len, msg=(window, seq_len))

  def test_matmul_params_match_the_model(self):
    for tie in (True, False):
      cfg = _tiny(tie_embeddings=tie)
      params = nnx.to_pure_dict(nnx.state(
          registry.create_model(cfg, rngs=nnx.Rngs(0)), nnx.Param))
      kernels = sum(
          leaf.size for path, leaf in
          jax.tree_util.tree_leaves_with_path(params)
          if path[-1].key == "kernel")
      head = 0 if not tie else cfg.embed_dim * cfg.vocab_size
      self.assertEqual(flops.matmul_params(cfg), kernels + head)

  def test_moe_counts_active_parameters(self):
    # Layer 0 dense (mlp_dim 8): 3*4*8 = 96. Layer 1: router 4*6 = 24, and
    # (2 routed + 1 shared) experts of 3*4*5 = 60 each, 180. Attention 48
    # per layer, head 40: 96 + 204 + 96 + 40 = 436.
    cfg = _tiny(num_experts=6, num_experts_per_token=2, moe_mlp_dim=5,
                num_shared_experts=1, first_dense_layers=1,
                tie_embeddings=False)
    self.assertEqual(flops.matmul_params(cfg), 436)
    params = nnx.to_pure_dict(nnx.state(
        registry.create_model(cfg, rngs=nnx.Rngs(0)), nnx.Param))
    # All matmul parameters minus the 4 experts a token skips.
    matmuls = sum(leaf.size for path, leaf in
                  jax.tree_util.tree_leaves_with_path(params)
                  if path[-1].key in ("kernel", "gate", "up", "down"))
    self.assertEqual(flops.matmul_params(cfg), matmuls - 4 * 60)

  def test_peak_flops_table(self):
    self.assertEqual(flops.peak_flops_per_device("TPU v5 lite"), 197e12)
    self.assertEqual(flops.peak_flops_per_device("TPU v5"), 459e12)
    self.assertEqual(flops.peak_flops_per_device("TPU v6 lite"), 918e12)
    self.assertEqual(flops.peak_flops_per_device("NVIDIA H100 80GB HBM3"),
                     989e12)
    self.assertEqual(flops.peak_flops_per_device("NVIDIA H100 PCIe"), 756e12)
    self.assertEqual(flops.peak_flops_per_device("NVIDIA H200"), 989e12)
    self.assertEqual(flops.peak_flops_per_device("cpu"), 0.0)
    self.assertEqual(flops.peak_flops_per_device("cpu", override=1e12), 1e12)


class VisionFlopsTest(absltest.TestCase):

  def test_equals_xla_count_of_the_tower(self):
    # Matmuls dominate at these sizes; XLA also counts the element-wise work
    # (norms, GELU, softmax), a few percent here. Unscanned: XLA counts a
    # loop's body once.
    cfg = _tiny(scan_layers=False, embed_dim=64, vision_layers=2, vision_embed_dim=128,
                vision_mlp_dim=256, vision_heads=4, vision_patch_size=8,
                vision_image_size=64, mm_tokens_per_image=16,
                image_token_id=9)
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    images = jax.ShapeDtypeStruct((1, 1, 64, 64, 3), np.float32)
    compiled = nnx.jit(lambda m, i: m.image_embeddings(i)).lower(
        model, images).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    want = flops.vision_flops_per_image(cfg, trained=False)
    self.assertAlmostEqual(cost["flops"] / want, 1.0, delta=0.06)
    self.assertEqual(flops.vision_flops_per_image(cfg, trained=True),
                     3 * want)
    self.assertEqual(flops.vision_flops_per_image(_tiny(), trained=True), 0)

  def test_llama4_tower_equals_xla_count(self):
    """Llama 4's tower (class token, 2-D rotary) and pixel-shuffle adapter,
    one tile."""
    cfg = _tiny(scan_layers=False, embed_dim=64, vision_layers=2,
                vision_embed_dim=256, vision_mlp_dim=1024, vision_heads=4,
                vision_patch_size=8, vision_image_size=64,
                mm_tokens_per_image=16, image_token_id=9,
                vision_arch="llama4", vision_adapter_dim=192,
                vision_activation="gelu")
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    tiles = jax.ShapeDtypeStruct((1, 1, 64, 64, 3), np.float32)
    cost = nnx.jit(lambda m, i: m.image_embeddings(i)).lower(
        model, tiles).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    self.assertAlmostEqual(
        cost["flops"] / flops.vision_flops_per_image(cfg, trained=False),
        1.0, delta=0.06)


if __name__ == "__main__":
  absltest.main()
