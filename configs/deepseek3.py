"""DeepSeek-V3 (and Kimi K2, the same architecture): small models for CPU,
and the published sizes.

Multi-head latent attention, sigmoid-routed experts with group-limited
routing and a shared expert after `first_dense_layers` dense layers, and
multi-token prediction (`maxtext.layers.mla`, `maxtext.layers.moe`,
`maxtext.models.mtp`).

Train the small default (4 layers, 16 experts, 4 per token, one prediction
depth) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/deepseek3.py

The tiny variant with expert parallelism on 8 fake CPU devices:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
  tools/bazel run //maxtext/bin:train -- --config=configs/deepseek3.py:tiny \
      --config.mesh.ici.data=1 --config.mesh.ici.fsdp=2 \
      --config.mesh.ici.expert=4

A published size (671b: DeepSeek-V3; kimi_k2: Kimi K2, 1T), with an
override:

  tools/bazel run //maxtext/bin:train -- --config=configs/deepseek3.py:671b \
      --config.model.moe_impl=capacity

Values follow the Hugging Face configs of deepseek-ai/DeepSeek-V3 and
moonshotai/Kimi-K2-Instruct (mlp_dim is their intermediate_size, the width
of the leading dense layers; head_dim is qk_rope_head_dim). Training
weights from the DeepSeek-V3 report: MTP loss 0.1 (its later phase), bias
update speed 0.001, balance loss 1e-4 (theirs is per sequence; ours over
the batch).
"""

import ml_collections

from configs import common

# Kimi K2 changes from DeepSeek-V3: vocabulary, 64 heads, 384 experts in one
# group, one dense layer, rotary base and YaRN settings, no MTP weights.
_KIMI_K2 = dict(
    vocab_size=163_840, num_heads=64, num_kv_heads=64, num_experts=384,
    num_expert_groups=1, expert_groups_per_token=1, first_dense_layers=1,
    routed_scaling_factor=2.827, rope_theta=50_000.0,
    rope_scaling_factor=32.0, rope_yarn_beta_fast=1.0,
    rope_yarn_beta_slow=1.0, mtp_layers=0)

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": common.DEEPSEEK3_SMALL,
    "tiny": dict(vocab_size=32_000, num_layers=3, embed_dim=64, mlp_dim=128,
                 moe_mlp_dim=32, num_heads=4, num_kv_heads=4, head_dim=8,
                 q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                 v_head_dim=16, num_experts=8, num_experts_per_token=2,
                 num_expert_groups=4, expert_groups_per_token=2,
                 first_dense_layers=1, rope_scaling_factor=4.0,
                 rope_original_max_length=64, dtype="float32"),
    "671b": dict(),
    "kimi_k2": _KIMI_K2,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config("deepseek3", arg, VARIANTS,
                              **common.DEEPSEEK3_SIZES)
