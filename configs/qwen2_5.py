"""Qwen 2.5 (dense): a small model for CPU, and the published sizes.

Train the small default (4 layers, about 11M parameters with the 32k-token
Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen2_5.py

A published size (0.5b, 1.5b, 3b, 7b, 14b, 32b, 72b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen2_5.py:7b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of Qwen/Qwen2.5-*.
"""

import ml_collections

from configs import common

# 7B and larger pad the vocabulary to 152,064 rows and untie the head.
_UNTIED = dict(vocab_size=152_064, tie_embeddings=False)

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256, mlp_dim=768,
                  num_heads=4, num_kv_heads=2, head_dim=64),
    "0.5b": dict(num_layers=24, embed_dim=896, mlp_dim=4864, num_heads=14,
                 num_kv_heads=2, head_dim=64),
    "1.5b": dict(num_layers=28, embed_dim=1536, mlp_dim=8960, num_heads=12,
                 num_kv_heads=2, head_dim=128),
    "3b": dict(num_layers=36, embed_dim=2048, mlp_dim=11_008, num_heads=16,
               num_kv_heads=2, head_dim=128),
    "7b": dict(num_layers=28, embed_dim=3584, mlp_dim=18_944, num_heads=28,
               num_kv_heads=4, head_dim=128, **_UNTIED),
    "14b": dict(num_layers=48, embed_dim=5120, mlp_dim=13_824, num_heads=40,
                num_kv_heads=8, head_dim=128, **_UNTIED),
    "32b": dict(num_layers=64, embed_dim=5120, mlp_dim=27_648, num_heads=40,
                num_kv_heads=8, head_dim=128, **_UNTIED),
    "72b": dict(num_layers=80, embed_dim=8192, mlp_dim=29_568, num_heads=64,
                num_kv_heads=8, head_dim=128, **_UNTIED),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  variant = arg or "small"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown qwen2_5 variant {variant!r}; valid variants: "
                     f"{sorted(VARIANTS)}.")
  config = common.base_config()

  model = config.model
  model.family = "qwen2_5"
  model.vocab_size = 151_936
  model.tie_embeddings = True
  model.dtype = "float32" if variant == "small" else "bfloat16"
  model.param_dtype = "float32"
  model.scan_layers = True
  model.attention_impl = "reference"
  model.norm_eps = 1e-6
  model.norm_offset = 0.0
  model.post_norms = False
  model.qk_norm = False
  model.qkv_bias = True
  model.scale_embeddings = False
  model.rope_theta = 1_000_000.0
  model.rope_scaling = "default"
  model.rope_scaling_factor = 1.0
  model.sliding_window = 0
  model.global_layer_interval = 1
  model.attn_logit_softcap = 0.0
  model.final_logit_softcap = 0.0
  model.mlp_activation = "silu"
  model.update(VARIANTS[variant])
  # Queries are scaled by head_dim**-0.5, following head_dim overrides.
  model.query_pre_attn_scalar = model.get_ref("head_dim")

  return config
