"""GPT-OSS (mixture of experts, attention sinks): a small model for CPU, and
the published sizes.

Train the small default (4 layers of 8 experts, 2 per token, sliding and
full attention layers alternating) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/gpt_oss.py

A published size (20b, 120b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/gpt_oss.py:20b \
      --config.model.moe_impl=capacity

Values follow the Hugging Face configs of openai/gpt-oss-20b and
openai/gpt-oss-120b (mlp_dim is their intermediate_size, used by no layer;
load_balance_loss_weight is their router_aux_loss_coef).
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=256, moe_mlp_dim=256, num_heads=4, num_kv_heads=2,
                  sliding_window=64, num_experts=8, num_experts_per_token=2,
                  load_balance_loss_weight=0.01),
    "20b": dict(num_layers=24, num_experts=32),
    "120b": dict(num_layers=36, num_experts=128),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "gpt_oss", arg, VARIANTS, vocab_size=201_088, embed_dim=2880,
      mlp_dim=2880, moe_mlp_dim=2880, num_heads=64, num_kv_heads=8,
      head_dim=64, tie_embeddings=False, norm_eps=1e-5,
      qkv_bias=True, attention_output_bias=True,
      # YaRN rotary (on every layer: maxtext/models/gpt_oss.py).
      rope_theta=150_000.0, rope_scaling="yarn",
      rope_scaling_factor=32.0, rope_original_max_length=4096,
      rope_yarn_beta_fast=32.0, rope_yarn_beta_slow=1.0,
      rope_yarn_truncate=False,
      # Layer 0 sliding, layer 1 full, ...
      sliding_window=128, global_layer_interval=2, num_experts_per_token=4,
      load_balance_loss_weight=0.9)
