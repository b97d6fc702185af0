"""Qwen3.5 (text, dense): a small hybrid model for CPU, and published sizes.

Train the small default (4 layers: 3 Gated DeltaNet, 1 full attention):

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen3_5.py

Published sizes ("9b", "27b") follow the `text_config` of the Hugging Face
configs of Qwen/Qwen3.5-9B and Qwen/Qwen3.5-27B (their vision towers and
multi-token prediction modules are not part of this model).
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=768, num_heads=4, num_kv_heads=2, head_dim=64,
                  linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=64, linear_value_head_dim=64),
    "9b": dict(num_layers=32, embed_dim=4096, mlp_dim=12_288,
               num_kv_heads=4),
    "27b": dict(num_layers=64, embed_dim=5120, mlp_dim=17_408, num_heads=24,
                num_kv_heads=4, linear_num_value_heads=48),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config("qwen3_5", arg, VARIANTS,
                              **common.QWEN3_NEXT_SIZES, vocab_size=248_320)
