"""Gemma 4 text decoder: a small model for CPU, and the published sizes.

Five local (sliding window) layers per global one; global layers with wider
heads, a quarter of their dimensions rotating, and (31b) no value
projection: their values are their keys' projection
(`maxtext.models.gemma4`).

Train the small default (6 layers: 2 local + 1 global, twice) on a CPU in a
few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma4.py

A published size (31b: google/gemma-4-31B, 30.70B parameters in its text
decoder; 26b-a4b: google/gemma-4-26B-A4B, 25.2B, 3.8B of them used per
token: 128 experts, 8 per token, next to a dense MLP in every layer; e2b and
e4b: google/gemma-4-E2B and -E4B, per-layer input embeddings (256 wide per
layer) and keys and values shared across the last 20 and 18 layers, e2b's
MLP twice as wide on those):

  tools/bazel run //maxtext/bin:aot_compile -- --config=configs/gemma4.py:31b

Values follow the `text_config` of the Hugging Face configs of
google/gemma-4-31B and google/gemma-4-26B-A4B; e2b and e4b follow their
published architecture (35 layers of width 1536, four local per global;
42 of width 2560, five per global; windows of 512; one and two kv heads;
values from their own projection), checked against the published totals in
maxtext/models/gemma4_test.py (no model hub is reachable here to read their
config.json).
"""

import ml_collections

from configs import common

# Sizes of each variant; the rest of the architecture is shared.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=6, embed_dim=256,
                  mlp_dim=1024, num_heads=4, num_kv_heads=2, head_dim=64,
                  global_head_dim=128, global_num_kv_heads=1,
                  sliding_window=128, global_layer_interval=3),
    "31b": dict(),
    "e2b": dict(num_layers=35, embed_dim=1536, mlp_dim=6144, num_heads=8,
                num_kv_heads=1, global_num_kv_heads=0,
                attention_global_k_eq_v=False, sliding_window=512,
                global_layer_interval=5, per_layer_input_dim=256,
                kv_shared_layers=20, mlp_kv_shared_dim=12_288),
    "e4b": dict(num_layers=42, embed_dim=2560, mlp_dim=10_240, num_heads=8,
                num_kv_heads=2, global_num_kv_heads=0,
                attention_global_k_eq_v=False, sliding_window=512,
                per_layer_input_dim=256, kv_shared_layers=18),
    "26b-a4b": dict(num_layers=30, embed_dim=2816, mlp_dim=2112,
                    num_heads=16, num_kv_heads=8, global_num_kv_heads=2,
                    num_experts=128, num_experts_per_token=8,
                    moe_mlp_dim=704,
                    **common.family_architecture("gemma4",
                                                 "MOE_ARCHITECTURE")),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "gemma4", arg, VARIANTS, vocab_size=262_144, num_layers=60,
      embed_dim=5376, mlp_dim=21_504, num_heads=32, num_kv_heads=16,
      head_dim=256, global_head_dim=512, global_num_kv_heads=4,
      attention_global_k_eq_v=True, sliding_window=1024,
      global_layer_interval=6, final_logit_softcap=30.0,
      rope_theta=1_000_000.0, rope_local_theta=10_000.0,
      rope_global_fraction=0.25)
