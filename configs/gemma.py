"""Gemma (1): a small model for CPU, and the published sizes.

Train the small default (4 layers, about 12M parameters with the 32k-token
Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma.py

A published size (2b, 7b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma.py:2b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of google/gemma-{2b,7b}.
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=1024, num_heads=4, num_kv_heads=1, head_dim=64),
    "2b": dict(num_layers=18, embed_dim=2048, mlp_dim=16_384, num_heads=8,
               num_kv_heads=1, head_dim=256),
    "7b": dict(num_layers=28, embed_dim=3072, mlp_dim=24_576, num_heads=16,
               num_kv_heads=16, head_dim=256),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  variant = arg or "small"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown gemma variant {variant!r}; valid variants: "
                     f"{sorted(VARIANTS)}.")
  config = common.base_config()

  model = config.model
  model.family = "gemma"
  model.vocab_size = 256_000
  model.tie_embeddings = True
  model.dtype = "float32" if variant == "small" else "bfloat16"
  model.param_dtype = "float32"
  model.scan_layers = True
  model.attention_impl = "reference"
  model.norm_eps = 1e-6
  model.norm_offset = 1.0
  model.post_norms = False
  model.qk_norm = False
  model.qkv_bias = False
  model.scale_embeddings = True
  model.rope_theta = 10_000.0
  model.rope_scaling = "default"
  model.rope_scaling_factor = 1.0
  model.sliding_window = 0
  model.global_layer_interval = 1
  model.attn_logit_softcap = 0.0
  model.final_logit_softcap = 0.0
  model.mlp_activation = "gelu_tanh"
  model.update(VARIANTS[variant])
  # Queries are scaled by head_dim**-0.5, following head_dim overrides.
  model.query_pre_attn_scalar = model.get_ref("head_dim")

  return config
