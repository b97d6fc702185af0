"""Mistral 7B: a small model for CPU, and the published sizes.

Train the small default (4 layers, sliding window 64, about 11M parameters
with the 32k-token Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/mistral.py

A published size, with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/mistral.py:7b \
      --config.optimizer.learning_rate=1e-4

Variants: 7b (Mistral-7B-v0.1: every layer has a 4096-token sliding
window), v0.3-7b (Mistral-7B-v0.3: no window, rotary base 1M, 32768-token
vocabulary). Values follow the Hugging Face configs of mistralai/*.
"""

import ml_collections

from configs import common

_MISTRAL_7B = dict(num_layers=32, embed_dim=4096, mlp_dim=14_336,
                   num_heads=32, num_kv_heads=8, head_dim=128)

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(num_layers=4, embed_dim=256, mlp_dim=768, num_heads=4,
                  num_kv_heads=2, head_dim=64, tie_embeddings=True,
                  sliding_window=64),
    "7b": _MISTRAL_7B,
    "v0.3-7b": dict(**_MISTRAL_7B, vocab_size=32_768, rope_theta=1e6,
                    sliding_window=0, global_layer_interval=1),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  variant = arg or "small"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown mistral variant {variant!r}; valid variants: "
                     f"{sorted(VARIANTS)}.")
  config = common.base_config()

  model = config.model
  model.family = "mistral"
  model.vocab_size = 32_000
  model.tie_embeddings = False
  model.dtype = "float32" if variant == "small" else "bfloat16"
  model.param_dtype = "float32"
  model.scan_layers = True
  model.attention_impl = "reference"
  model.norm_eps = 1e-5
  model.norm_offset = 0.0
  model.post_norms = False
  model.qk_norm = False
  model.qkv_bias = False
  model.scale_embeddings = False
  model.rope_theta = 10_000.0
  model.rope_scaling = "default"
  model.rope_scaling_factor = 1.0
  # Every layer is local (global_layer_interval=0) when there is a window.
  model.sliding_window = 4096
  model.global_layer_interval = 0
  model.attn_logit_softcap = 0.0
  model.final_logit_softcap = 0.0
  model.mlp_activation = "silu"
  model.update(VARIANTS[variant])
  # Local layers rotate like global ones; queries scale by head_dim**-0.5.
  model.rope_local_theta = model.get_ref("rope_theta")
  model.query_pre_attn_scalar = model.get_ref("head_dim")

  return config
