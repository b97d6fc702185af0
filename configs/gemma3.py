"""Gemma 3 text decoder: a small model for CPU, and the published sizes.

Train the small default (6 layers: 5 local + 1 global, about 14M parameters
with the 32k-token Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma3.py

A published size (text-only decoder; 1b, 4b, 12b, 27b; with the vision
tower: 4b_vlm, 12b_vlm, 27b_vlm), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma3.py:1b \
      --config.optimizer.learning_rate=1e-4

Architecture values follow the Hugging Face configs of google/gemma-3-*-pt.
"""

import ml_collections

from configs import common

# Sizes of each variant; the rest of the architecture is shared.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=6, embed_dim=256, mlp_dim=1024,
                  num_heads=4, num_kv_heads=1, head_dim=64,
                  query_pre_attn_scalar=64.0, sliding_window=128),
    "1b": dict(vocab_size=262_144, num_layers=26, embed_dim=1152, mlp_dim=6912,
               num_heads=4, num_kv_heads=1, head_dim=256,
               query_pre_attn_scalar=256.0, sliding_window=512),
    "4b": dict(vocab_size=262_208, num_layers=34, embed_dim=2560,
               mlp_dim=10_240, num_heads=8, num_kv_heads=4, head_dim=256,
               query_pre_attn_scalar=256.0, sliding_window=1024,
               rope_scaling="linear", rope_scaling_factor=8.0),
    "12b": dict(vocab_size=262_208, num_layers=48, embed_dim=3840,
                mlp_dim=15_360, num_heads=16, num_kv_heads=8, head_dim=256,
                query_pre_attn_scalar=256.0, sliding_window=1024,
                rope_scaling="linear", rope_scaling_factor=8.0),
    "27b": dict(vocab_size=262_208, num_layers=62, embed_dim=5376,
                mlp_dim=21_504, num_heads=32, num_kv_heads=16, head_dim=128,
                query_pre_attn_scalar=168.0, sliding_window=1024,
                rope_scaling="linear", rope_scaling_factor=8.0),
}


# The vision-language releases (google/gemma-3-{4b,12b,27b}-it): the text
# decoder of their size and one SigLIP-So400m tower, 896 x 896 images in 256
# soft tokens.
VISION = dict(vision_layers=27, vision_embed_dim=1152, vision_mlp_dim=4304,
              vision_heads=16, vision_patch_size=14, vision_image_size=896,
              mm_tokens_per_image=256, image_token_id=262_144,
              image_start_id=255_999, image_end_id=256_000)
VARIANTS.update({f"{size}_vlm": {**VARIANTS[size], **VISION}
                 for size in ("4b", "12b", "27b")})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "gemma3", arg, VARIANTS, rope_theta=1_000_000.0,
      rope_local_theta=10_000.0, global_layer_interval=6,
      mlp_activation="gelu_tanh")
