"""DeepSeek-V2 and V2-Lite: small models for CPU, and the published sizes.

Multi-head latent attention (V2-Lite without low-rank queries), softmax-
routed experts (V2: group-limited, each group scored by its best expert;
V2-Lite: plain top-k) with two shared experts after one dense layer
(`maxtext.models.deepseek2`).

Train the small default (4 layers, 16 experts in 4 groups, 4 per token) on a
CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/deepseek2.py

A published size (236b: DeepSeek-V2, lite: DeepSeek-V2-Lite, 15.7B):

  tools/bazel run //maxtext/bin:train -- --config=configs/deepseek2.py:lite

Values follow the Hugging Face configs of deepseek-ai/DeepSeek-V2 and
deepseek-ai/DeepSeek-V2-Lite (mlp_dim is their intermediate_size, the width
of the leading dense layer; head_dim is qk_rope_head_dim; their
aux_loss_alpha, the expert-level balance loss, is 0.001).
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config` (236b).
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=512, moe_mlp_dim=128, num_heads=4, num_kv_heads=4,
                  head_dim=16, q_lora_rank=64, kv_lora_rank=64,
                  qk_nope_head_dim=32, v_head_dim=32, num_experts=16,
                  num_experts_per_token=4, num_expert_groups=4,
                  expert_groups_per_token=2, routed_scaling_factor=1.0,
                  rope_scaling_factor=4.0, rope_original_max_length=64),
    "tiny": dict(vocab_size=32_000, num_layers=3, embed_dim=64, mlp_dim=128,
                 moe_mlp_dim=32, num_heads=4, num_kv_heads=4, head_dim=8,
                 q_lora_rank=0, kv_lora_rank=32, qk_nope_head_dim=16,
                 v_head_dim=16, num_experts=8, num_experts_per_token=2,
                 num_expert_groups=1, expert_groups_per_token=1,
                 routed_scaling_factor=1.0, rope_scaling_factor=4.0,
                 rope_original_max_length=64, dtype="float32"),
    "236b": dict(),
    "lite": dict(num_layers=27, embed_dim=2048, mlp_dim=10_944,
                 moe_mlp_dim=1408, num_heads=16, num_kv_heads=16,
                 q_lora_rank=0, num_experts=64, num_expert_groups=1,
                 expert_groups_per_token=1, routed_scaling_factor=1.0),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "deepseek2", arg, VARIANTS, vocab_size=102_400, num_layers=60,
      embed_dim=5120, mlp_dim=12_288, moe_mlp_dim=1536, num_heads=128,
      num_kv_heads=128, head_dim=64, tie_embeddings=False, norm_eps=1e-6,
      q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
      v_head_dim=128, rope_theta=10_000.0,
      rope_scaling="yarn", rope_scaling_factor=40.0,
      rope_original_max_length=4096, rope_yarn_beta_fast=32.0,
      rope_yarn_beta_slow=1.0, rope_yarn_mscale=0.707,
      rope_yarn_mscale_all_dim=0.707, num_experts=160,
      num_experts_per_token=6, num_shared_experts=2, first_dense_layers=1,
      router_normalize=False, routed_scaling_factor=16.0,
      num_expert_groups=8, expert_groups_per_token=3,
      load_balance_loss_weight=0.001)
