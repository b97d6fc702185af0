"""`ModelConfig`: the typed, validated description of a decoder.

Built once at the boundary from the `model` section of a config file:

  cfg = ModelConfig.from_dict(config.model)

Every field has a full-word name; a model family's config file sets them. Shared
code reads these fields and never branches on `family`.

Layer pattern: with `sliding_window > 0`, layer `i` (0-based) is global when
`(i + 1) % global_layer_interval == 0` and local (sliding window) otherwise;
`global_layer_interval = 0` makes every layer local. Local layers use plain
rotary embeddings with base `rope_local_theta` (None: the global layers'
rotary, as in GPT-OSS); global layers use base `rope_theta` and the
`rope_scaling` kind.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from maxtext.common import model_checks
from maxtext.common import sections

DTYPES = ("float32", "bfloat16")
ROPE_SCALINGS = ("default", "linear", "llama3", "yarn")
MLP_ACTIVATIONS = ("silu", "gelu_tanh", "clamped_swiglu")
# The parts' choices (attention types, router scores, MoE implementations)
# and checks live in model_checks.
_fail = model_checks.fail
# Keys that were `model` fields and are not architecture: how a model runs
# (`maxtext.models.execution`). Old key -> its section and key now.
MOVED_KEYS = {
    "attention_impl": "attention_kernel.impl",
    "attention_block_q": "attention_kernel.block_q",
    "attention_block_kv": "attention_kernel.block_kv",
    "context_parallel": "attention_kernel.context_parallel",
    "remat_policy": "remat.policy",
    "remat_custom": "remat.custom",
    "pipeline_stages": "pipeline.stages",
    "pipeline_microbatches": "pipeline.microbatches",
    "pipeline_repeats": "pipeline.repeats",
}


def migrate(values: Mapping[str, Any]) -> dict[str, Any]:
  """The `ModelConfig` fields of a `model` mapping written by an earlier
  version (a converted checkpoint's `model_config.json`, a workdir's
  `config.json`): the keys that moved out (`MOVED_KEYS`) recorded how that
  run ran, not the model, and are dropped."""
  if hasattr(values, "to_dict"):
    values = values.to_dict()
  return {key: value for key, value in values.items()
          if key not in MOVED_KEYS}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Architecture of a decoder-only transformer (dense or with experts).

  Attributes:
    family: Model family, a key of `maxtext.models.registry`.
    vocab_size: Number of token ids.
    num_layers: Number of decoder blocks.
    embed_dim: Width of the residual stream.
    mlp_dim: Hidden width of the gated MLP.
    num_heads: Query heads.
    num_kv_heads: Key/value heads; divides `num_heads` (GQA, MQA when 1).
    head_dim: Width of one attention head.
    tie_embeddings: The output head reuses the token embedding.
    dtype: Compute dtype name.
    param_dtype: Parameter dtype name.
    scan_layers: Stack the blocks' parameters and run them with a scan, so
      compile time does not grow with depth.
    norm_eps: RMSNorm epsilon.
    norm_offset: RMSNorm multiplies by `norm_offset + scale` (Gemma: 1.0, with
      the scale initialised to zero).
    post_norms: Also normalise the outputs of attention and MLP before the
      residual add (Gemma 2/3 "sandwich" norms).
    qk_norm: RMSNorm over the head dim of queries and keys.
    qkv_bias: The query, key and value projections add a bias (Qwen 2.5,
      GPT-OSS).
    attention_output_bias: The attention output projection adds a bias
      (GPT-OSS).
    attention_sinks: Each query head has a learned sink logit that joins its
      softmax denominator (GPT-OSS; `maxtext.kernels.attention`).
    scale_embeddings: Multiply token embeddings by sqrt(embed_dim).
    rope_theta: Rotary base of global layers.
    rope_local_theta: Rotary base of local (sliding window) layers; None:
      local layers use the global layers' rotary (base and scaling).
    rope_scaling: Frequency scaling of global layers: "default" (none),
      "linear" (positions divided by `rope_scaling_factor`), "llama3" or
      "yarn" (`maxtext.layers.rope`).
    rope_scaling_factor: Factor of the "linear", "llama3" and "yarn"
      scalings.
    rope_low_freq_factor: "llama3" scaling: low-frequency factor.
    rope_high_freq_factor: "llama3" scaling: high-frequency factor.
    rope_original_max_length: "llama3" and "yarn" scalings: pre-training
      context length.
    rope_yarn_beta_fast: "yarn": rotations bounding the blend (fast end).
    rope_yarn_beta_slow: "yarn": rotations bounding the blend (slow end).
    rope_yarn_truncate: "yarn": round the blend's bounds to whole dimensions.
    rope_yarn_mscale: "yarn": attention factor numerator's mscale (0: unset).
    rope_yarn_mscale_all_dim: "yarn": its denominator's mscale (0: unset);
      see `maxtext.layers.rope.attention_factor`.
    sliding_window: Keys a local layer's query sees, itself included; 0 means
      every layer is global.
    global_head_dim: Width of a global layer's attention heads when it
      differs from `head_dim` (Gemma 4); 0: `head_dim`. Such layers are a
      layer kind of their own (`maxtext.common.layer_pattern`).
    global_num_kv_heads: A global layer's key/value heads when they differ
      from `num_kv_heads`; 0: `num_kv_heads`.
    global_layer_interval: Every this-many-th layer is global (see module
      docstring); 0 means none is.
    query_pre_attn_scalar: Queries are scaled by `query_pre_attn_scalar**-0.5`;
      None means `head_dim`.
    attn_logit_softcap: Attention logits become `c * tanh(logits / c)`; 0 is
      off.
    final_logit_softcap: Same for the output logits; 0 is off.
    mlp_activation: Gated unit of the MLP and experts: "silu" (SwiGLU),
      "gelu_tanh" (GeGLU) or "clamped_swiglu" (GPT-OSS;
      `maxtext.layers.mlp.clamped_swiglu`).
    num_experts: Mixture of experts (`maxtext.layers.moe`): routed experts
      of each MoE layer; 0 means a dense MLP in every layer.
    num_experts_per_token: Experts each token is sent to (top-k).
    moe_mlp_dim: Hidden width of one expert (and of one shared expert).
    num_shared_experts: Experts every token also goes through, unweighted,
      as one MLP of width `num_shared_experts * moe_mlp_dim` (DeepSeek).
    first_dense_layers: The first this-many layers have a dense MLP of width
      `mlp_dim` instead of experts (DeepSeek's first_k_dense_replace).
    moe_layer_interval: After those, layer `i` has experts when
      `(i + 1) % moe_layer_interval == 0` and the dense MLP otherwise
      (Llama 4's interleave_moe_layer_step); 1: every one has experts.
    router_score: "softmax" over the experts (Mixtral, Qwen 3 MoE) or
      per-expert "sigmoid" (DeepSeek-V3).
    router_normalize: The chosen experts' weights are divided by their sum.
    router_bias: A per-expert bias, added to the scores only to choose the
      experts (DeepSeek-V3's e_score_correction_bias); it is not trained by
      gradients but moved by `maxtext.layers.moe.update_router_bias`.
    router_bias_update_rate: After each training update, each expert's
      `router_bias` moves by this much against its load of that step
      (DeepSeek-V3's auxiliary-loss-free balancing, their gamma = 0.001);
      0 is off. Needs router_bias=True.
    router_logit_bias: The router adds a trained per-expert bias to its
      logits (GPT-OSS); unlike router_bias it also changes the weights.
    expert_bias: The routed experts' gate, up and down projections add a
      per-expert bias (GPT-OSS).
    expert_gate_up_fused: The routed experts' gate and up projections are
      one parameter `gate_up` [experts, embed, 2, moe_mlp_dim] (GPT-OSS
      checkpoints store them as one tensor) instead of `gate` and `up`.
    routed_scaling_factor: Multiplies the routed experts' weights.
    num_expert_groups: Experts are split into this many groups; a token
      chooses experts only within its best `expert_groups_per_token` groups
      (a group's score: the sum of its two best scores). 1 is off.
    expert_groups_per_token: Groups each token may choose experts from.
    moe_impl: "dropless" (tokens sorted by expert, grouped matmuls with
      `jax.lax.ragged_dot`), "capacity" (each expert takes at most
      `capacity_factor * tokens * num_experts_per_token / num_experts`
      tokens; the rest are dropped and counted) or "dense" (every expert
      runs on every token: the reference).
    capacity_factor: See moe_impl="capacity".
    load_balance_loss_weight: Weight of the auxiliary load-balancing loss
      `num_experts * sum_e f_e * p_e` added to the training objective (f_e
      the fraction of tokens routed to expert e, p_e its mean router
      probability); 0 is off.
    router_z_loss_weight: Weight of the router z-loss, the mean of
      logsumexp(router logits)^2; 0 is off.
    attention_type: "gqa" (`maxtext.layers.attention`) or "mla", DeepSeek's
      multi-head latent attention (`maxtext.layers.mla`). With "mla",
      `head_dim` is the width of the decoupled rotary part of each query
      and key head (DeepSeek's qk_rope_head_dim) and num_kv_heads equals
      num_heads.
    q_lora_rank: "mla": rank of the low-rank query projection; 0 means one
      full query projection.
    kv_lora_rank: "mla": width of the compressed key/value latent (what
      the KV cache stores per token, with the rotary key).
    qk_nope_head_dim: "mla": width of the non-rotary part of each query and
      key head (the softmax scale is (qk_nope_head_dim + head_dim)**-0.5).
    v_head_dim: "mla": width of each value head.
    rope_interleave: "mla": the rotary part pairs dimensions (0, 1), (2, 3),
      ... (DeepSeek's checkpoints) instead of (k, k + K/2).
    mtp_layers: DeepSeek-V3 multi-token prediction: depth-k modules
      (`maxtext.models.mtp`) predicting the token k + 1 ahead; 0 is off.
    mtp_loss_weight: Weight of the mean over depths of their cross-entropy
      in the training objective.
  """

  # Keys moved to other sections (`sections.build_section` names them).
  MOVED_KEYS: ClassVar[dict[str, str]] = MOVED_KEYS

  family: str
  vocab_size: int
  num_layers: int
  embed_dim: int
  mlp_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  tie_embeddings: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = True
  norm_eps: float = 1e-6
  norm_offset: float = 0.0
  post_norms: bool = False
  qk_norm: bool = False
  qkv_bias: bool = False
  attention_output_bias: bool = False
  attention_sinks: bool = False
  scale_embeddings: bool = False
  rope_theta: float = 10_000.0
  rope_local_theta: float | None = 10_000.0
  rope_scaling: str = "default"
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_length: int = 8192
  rope_yarn_beta_fast: float = 32.0
  rope_yarn_beta_slow: float = 1.0
  rope_yarn_truncate: bool = True
  rope_yarn_mscale: float = 0.0
  rope_yarn_mscale_all_dim: float = 0.0
  sliding_window: int = 0
  global_layer_interval: int = 1
  global_head_dim: int = 0
  global_num_kv_heads: int = 0
  query_pre_attn_scalar: float | None = None
  attn_logit_softcap: float = 0.0
  final_logit_softcap: float = 0.0
  mlp_activation: str = "silu"
  num_experts: int = 0
  num_experts_per_token: int = 1
  moe_mlp_dim: int = 0
  num_shared_experts: int = 0
  first_dense_layers: int = 0
  moe_layer_interval: int = 1
  router_score: str = "softmax"
  router_normalize: bool = True
  router_bias: bool = False
  router_logit_bias: bool = False
  expert_bias: bool = False
  expert_gate_up_fused: bool = False
  router_bias_update_rate: float = 0.0
  routed_scaling_factor: float = 1.0
  num_expert_groups: int = 1
  expert_groups_per_token: int = 1
  moe_impl: str = "dropless"
  capacity_factor: float = 1.25
  load_balance_loss_weight: float = 0.0
  router_z_loss_weight: float = 0.0
  attention_type: str = "gqa"
  q_lora_rank: int = 0
  kv_lora_rank: int = 0
  qk_nope_head_dim: int = 0
  v_head_dim: int = 0
  rope_interleave: bool = False
  mtp_layers: int = 0
  mtp_loss_weight: float = 0.0

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    """Builds a config from a mapping (e.g. the `model` ConfigDict section).

    Raises:
      TypeError: a key is not a field (the error lists the valid fields).
      ValueError: a key moved out of the model (`MOVED_KEYS`).
    """
    if hasattr(values, "to_dict"):
      values = values.to_dict()
    sections.check_moved("model", cls, values)
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields))
    if unknown:
      raise TypeError(
          f"Unknown ModelConfig field(s) {unknown}; valid fields: {fields}."
      )
    return cls(**values)

  def __post_init__(self):
    if not self.family:
      _fail("family", self.family, "must be a non-empty family name")
    for name in ("vocab_size", "num_layers", "embed_dim", "mlp_dim",
                 "num_heads", "num_kv_heads", "head_dim"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(name, value, "must be a positive integer")
    if self.num_heads % self.num_kv_heads:
      _fail("num_kv_heads", self.num_kv_heads,
            f"must divide num_heads={self.num_heads}")
    if self.head_dim % 2:
      _fail("head_dim", self.head_dim, "must be even (rotary embeddings)")
    for name in ("tie_embeddings", "scan_layers", "post_norms", "qk_norm",
                 "qkv_bias", "attention_output_bias", "attention_sinks",
                 "scale_embeddings", "rope_yarn_truncate"):
      if not isinstance(getattr(self, name), bool):
        _fail(name, getattr(self, name), "must be True or False")
    for name, valid in (("dtype", DTYPES), ("param_dtype", DTYPES),
                        ("rope_scaling", ROPE_SCALINGS),
                        ("mlp_activation", MLP_ACTIVATIONS)):
      if getattr(self, name) not in valid:
        _fail(name, getattr(self, name), f"valid values are {valid}")
    for name in ("norm_eps", "rope_theta"):
      if getattr(self, name) <= 0:
        _fail(name, getattr(self, name), "must be positive")
    if self.rope_local_theta is not None and self.rope_local_theta <= 0:
      _fail("rope_local_theta", self.rope_local_theta,
            "must be positive, or None (the global layers' rotary)")
    for name in ("attn_logit_softcap", "final_logit_softcap", "sliding_window",
                 "global_layer_interval"):
      if getattr(self, name) < 0:
        _fail(name, getattr(self, name), "must be >= 0 (0 turns it off)")
    if self.rope_scaling == "default" and self.rope_scaling_factor != 1.0:
      _fail("rope_scaling_factor", self.rope_scaling_factor,
            'must be 1.0 when rope_scaling="default"')
    if self.rope_scaling != "default" and self.rope_scaling_factor < 1.0:
      _fail("rope_scaling_factor", self.rope_scaling_factor,
            f"must be >= 1.0 for rope_scaling={self.rope_scaling!r}")
    if self.rope_scaling == "llama3" and not (
        0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
      _fail("rope_high_freq_factor", self.rope_high_freq_factor,
            "llama3 scaling needs 0 < rope_low_freq_factor "
            f"({self.rope_low_freq_factor}) < rope_high_freq_factor")
    # Equal bounds are allowed (Kimi K2: both 1).
    if self.rope_scaling == "yarn" and not (
        0 < self.rope_yarn_beta_slow <= self.rope_yarn_beta_fast):
      _fail("rope_yarn_beta_fast", self.rope_yarn_beta_fast,
            "yarn scaling needs 0 < rope_yarn_beta_slow "
            f"({self.rope_yarn_beta_slow}) <= rope_yarn_beta_fast")
    if self.rope_original_max_length < 1:
      _fail("rope_original_max_length", self.rope_original_max_length,
            "must be a positive integer")
    if self.sliding_window == 0 and self.global_layer_interval != 1:
      _fail("global_layer_interval", self.global_layer_interval,
            "must be 1 when sliding_window=0 (every layer is global)")
    if self.sliding_window > 0 and self.global_layer_interval == 1:
      _fail("global_layer_interval", self.global_layer_interval,
            f"1 makes every layer global, so sliding_window="
            f"{self.sliding_window} is unused; use 0 for all-local layers or "
            "set sliding_window=0")
    scalar = self.query_pre_attn_scalar
    if scalar is not None and scalar <= 0:
      _fail("query_pre_attn_scalar", self.query_pre_attn_scalar,
            "must be positive or None (None means head_dim)")
    model_checks.check_moe(self)
    model_checks.check_global_sizes(self)
    model_checks.check_mla(self)
    model_checks.check_mtp(self)

  def moe_layer(self, layer: int) -> bool:
    """Whether layer `layer` (0-based) has experts instead of a dense MLP."""
    return (self.num_experts > 0 and layer >= self.first_dense_layers
            and (layer + 1) % self.moe_layer_interval == 0)

  def layer_windows(self) -> tuple[int | None, ...]:
    """Sliding window of each layer; None for a global layer."""
    if self.sliding_window == 0:
      return (None,) * self.num_layers
    interval = self.global_layer_interval
    return tuple(
        None if interval and (i + 1) % interval == 0 else self.sliding_window
        for i in range(self.num_layers))

  @property
  def query_scale(self) -> float:
    """Multiplier applied to queries before the dot product with keys
    (with MLA, their width is qk_nope_head_dim + head_dim)."""
    scalar = self.query_pre_attn_scalar or (
        self.head_dim + self.qk_nope_head_dim)
    return scalar**-0.5
