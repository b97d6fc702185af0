"""Qwen3.5 MoE (text): a small hybrid model for CPU, and published sizes.

Train the small default (4 layers: 3 Gated DeltaNet, 1 full attention; 16
experts, 4 per token, and a gated shared expert):

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen3_5_moe.py

Published sizes ("35b-a3b", "397b-a17b") follow the `text_config` of the
Hugging Face configs of Qwen/Qwen3.5-35B-A3B and Qwen/Qwen3.5-397B-A17B
(their vision towers and multi-token prediction modules are not part of
this model; mlp_dim, which no layer uses, is the experts' width).
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=128, num_heads=4, num_kv_heads=2, head_dim=64,
                  linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=64, linear_value_head_dim=64,
                  num_experts=16, num_experts_per_token=4, moe_mlp_dim=128,
                  shared_expert_mlp_dim=128),
    "35b-a3b": dict(num_layers=40, embed_dim=2048, mlp_dim=512),
    "397b-a17b": dict(num_layers=60, embed_dim=4096, mlp_dim=1024,
                      num_heads=32, linear_num_value_heads=64,
                      num_experts=512, num_experts_per_token=10,
                      moe_mlp_dim=1024, shared_expert_mlp_dim=1024),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "qwen3_5_moe", arg, VARIANTS, **common.QWEN3_NEXT_SIZES,
      **common.QWEN3_NEXT_MOE_SIZES, vocab_size=248_320, num_experts=256,
      num_experts_per_token=8, moe_mlp_dim=512, shared_expert_mlp_dim=512)
