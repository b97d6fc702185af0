"""Llama 4 (text): small models for CPU, and the published sizes.

Chunked-attention layers with interleaved rotary and, every fourth layer, a
NoPE layer with full attention and temperature tuning; sigmoid top-1 experts
applied to their input plus a shared expert, in every layer (Scout) or every
second one between dense MLPs (Maverick) (`maxtext.models.llama4`).

Train the small default (4 layers, 8 experts, chunks of 64 tokens) on a CPU
in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/llama4.py

A published size (scout: Llama-4-Scout-17B-16E, 108B parameters in its text
model; maverick: Llama-4-Maverick-17B-128E, 400B):

  tools/bazel run //maxtext/bin:aot_compile -- --config=configs/llama4.py:scout

Values follow the `text_config` of the Hugging Face configs of
meta-llama/Llama-4-Scout-17B-16E and meta-llama/Llama-4-Maverick-17B-128E
(Scout: Llama 3 rotary scaling by 16 over an 8192-token original context,
q/k norms; Maverick: no scaling, no q/k norms, experts in every second
layer). mlp_dim is their intermediate_size_mlp (the dense layers' width),
moe_mlp_dim their intermediate_size (an expert's and the shared expert's).

"scout_vlm" and "maverick_vlm" add the released models' vision tower
(`maxtext.layers.vision`, vision_arch "llama4": 34 layers of width 1408
over 336-pixel tiles in 14-pixel patches, pixel-shuffled into 144 soft
tokens per tile, a 4096-wide adapter) and their image token ids
(<|patch|>, <|image_start|>, <|image_end|>), as in their `vision_config`.
"""

import ml_collections

from configs import common

# Scout's rotary: Llama 3 scaling by 16 over an 8192-token original context
# (equal low and high frequency factors: no blended band).
_SCOUT_ROPE = dict(rope_scaling="llama3", rope_scaling_factor=16.0,
                   rope_low_freq_factor=1.0, rope_high_freq_factor=1.0,
                   rope_original_max_length=8192)
# The released models' vision tower (both share it).
_VISION = dict(vision_layers=34, vision_embed_dim=1408, vision_mlp_dim=5632,
               vision_heads=16, vision_patch_size=14, vision_image_size=336,
               vision_norm_eps=1e-5, vision_activation="gelu",
               vision_arch="llama4", vision_adapter_dim=4096,
               vision_rope_theta=10_000.0, mm_tokens_per_image=144,
               image_token_id=200_092, image_start_id=200_080,
               image_end_id=200_081)
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=512, moe_mlp_dim=256, num_heads=4, num_kv_heads=2,
                  head_dim=64, num_experts=8, attention_chunk_size=64,
                  attn_temperature_floor_scale=64),
    "tiny": dict(vocab_size=32_000, num_layers=4, embed_dim=64, mlp_dim=128,
                 moe_mlp_dim=64, num_heads=4, num_kv_heads=2, head_dim=16,
                 num_experts=4, attention_chunk_size=16, moe_layer_interval=2,
                 attn_temperature_floor_scale=8, dtype="float32"),
    "scout": _SCOUT_ROPE,
    "maverick": dict(num_experts=128, moe_layer_interval=2,
                     qk_l2_norm=False),
}
VARIANTS["scout_vlm"] = dict(VARIANTS["scout"], **_VISION)
VARIANTS["maverick_vlm"] = dict(VARIANTS["maverick"], **_VISION)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "llama4", arg, VARIANTS, vocab_size=202_048, num_layers=48,
      embed_dim=5120, mlp_dim=16_384, moe_mlp_dim=8192, num_heads=40,
      num_kv_heads=8, head_dim=128, tie_embeddings=False, norm_eps=1e-5,
      rope_theta=500_000.0, attention_chunk_size=8192,
      global_layer_interval=4, num_experts=16, num_experts_per_token=1,
      qk_l2_norm=True, attn_temperature_scale=0.1,
      attn_temperature_floor_scale=8192, load_balance_loss_weight=0.001)
