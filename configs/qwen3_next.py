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
      "qwen3_next", arg, VARIANTS, **common.QWEN3_NEXT_SIZES,
      vocab_size=151_936, num_experts=512, num_experts_per_token=10, moe_mlp_dim=512,
      shared_expert_mlp_dim=512, **common.QWEN3_NEXT_MOE_SIZES)

