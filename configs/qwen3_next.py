"""Qwen3-Next: a small hybrid model for CPU, and the published size.

Train the small default (4 layers: 3 Gated DeltaNet, 1 full attention; 16
experts, 4 per token, and a gated shared expert) on a CPU:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen3_next.py

Values of "80b-a3b" follow the Hugging Face config of
Qwen/Qwen3-Next-80B-A3B-Instruct (mlp_dim is its intermediate_size, used by
no layer).
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=768, num_heads=4, num_kv_heads=2, head_dim=64,
                  linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=64, linear_value_head_dim=64,
                  num_experts=16, num_experts_per_token=4, moe_mlp_dim=128,
                  shared_expert_mlp_dim=128),
    "80b-a3b": dict(num_layers=48, embed_dim=2048, mlp_dim=5120),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "qwen3_next", arg, VARIANTS, **SHARED_SIZES, vocab_size=151_936,
      num_experts=512, num_experts_per_token=10, moe_mlp_dim=512,
      shared_expert_mlp_dim=512, **MOE_SIZES)


# The sizes Qwen3-Next and Qwen3.5 (`configs/qwen3_5.py`,
# `configs/qwen3_5_moe.py`) share.
SHARED_SIZES = dict(
    num_heads=16, num_kv_heads=2, head_dim=256, tie_embeddings=False,
    rope_theta=10_000_000.0, rope_partial_factor=0.25,
    linear_num_key_heads=16, linear_num_value_heads=32,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_taps=4,
    full_attention_interval=4)
MOE_SIZES = dict(num_shared_experts=1, shared_expert_gate=True,
                 router_normalize=True, load_balance_loss_weight=0.001)
