"""Llama 2: a small model for CPU, and the published sizes.

Train the small default (4 layers, about 12M parameters with the 32k-token
Mistral tokenizer, which is Llama 2's) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/llama2.py

A published size (7b, 13b, 70b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/llama2.py:7b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of meta-llama/Llama-2-*-hf.
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(num_layers=4, embed_dim=256, mlp_dim=768, num_heads=4,
                  num_kv_heads=4, head_dim=64, tie_embeddings=True),
    "7b": dict(num_layers=32, embed_dim=4096, mlp_dim=11_008, num_heads=32,
               num_kv_heads=32, head_dim=128),
    "13b": dict(num_layers=40, embed_dim=5120, mlp_dim=13_824, num_heads=40,
                num_kv_heads=40, head_dim=128),
    "70b": dict(num_layers=80, embed_dim=8192, mlp_dim=28_672, num_heads=64,
                num_kv_heads=8, head_dim=128),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  variant = arg or "small"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown llama2 variant {variant!r}; valid variants: "
                     f"{sorted(VARIANTS)}.")
  config = common.base_config()

  model = config.model
  model.family = "llama2"
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
  model.sliding_window = 0
  model.global_layer_interval = 1
  model.attn_logit_softcap = 0.0
  model.final_logit_softcap = 0.0
  model.mlp_activation = "silu"
  model.update(VARIANTS[variant])
  # Queries are scaled by head_dim**-0.5, following head_dim overrides.
  model.query_pre_attn_scalar = model.get_ref("head_dim")

  return config
