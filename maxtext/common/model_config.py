"""`ModelConfig`: the typed, validated description of a dense decoder.

Built once at the boundary from the `model` section of a config file:

  cfg = ModelConfig.from_dict(config.model)

Every field has a full-word name; a model family's config file sets them. Shared
code reads these fields and never branches on `family`.

Layer pattern: with `sliding_window > 0`, layer `i` (0-based) is global when
`(i + 1) % global_layer_interval == 0` and local (sliding window) otherwise;
`global_layer_interval = 0` makes every layer local. Local layers use plain
rotary embeddings with base `rope_local_theta`; global layers use base
`rope_theta` and the `rope_scaling` kind.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

DTYPES = ("float32", "bfloat16")
ROPE_SCALINGS = ("default", "linear", "llama3")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")
ATTENTION_IMPLS = ("reference", "xla")
# See maxtext.layers.remat.
REMAT_POLICIES = ("none", "full", "minimal", "save_dot_except_mlp",
                  "save_qkv_proj", "save_out_proj", "nothing_saveable")


def _fail(field: str, value: Any, valid: str) -> None:
  raise ValueError(f"ModelConfig.{field}={value!r} is invalid: {valid}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Architecture of a dense decoder-only transformer.

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
    attention_impl: "reference" (plain JAX) or "xla"
      (`jax.nn.dot_product_attention` with JAX's choice of backend).
    norm_eps: RMSNorm epsilon.
    norm_offset: RMSNorm multiplies by `norm_offset + scale` (Gemma: 1.0, with
      the scale initialised to zero).
    post_norms: Also normalise the outputs of attention and MLP before the
      residual add (Gemma 2/3 "sandwich" norms).
    qk_norm: RMSNorm over the head dim of queries and keys.
    qkv_bias: The query, key and value projections add a bias (Qwen 2.5);
      the output projection never has one.
    scale_embeddings: Multiply token embeddings by sqrt(embed_dim).
    rope_theta: Rotary base of global layers.
    rope_local_theta: Rotary base of local (sliding window) layers.
    rope_scaling: Frequency scaling of global layers: "default" (none),
      "linear" (positions divided by `rope_scaling_factor`) or "llama3".
    rope_scaling_factor: Factor of the "linear" and "llama3" scalings.
    rope_low_freq_factor: "llama3" scaling: low-frequency factor.
    rope_high_freq_factor: "llama3" scaling: high-frequency factor.
    rope_original_max_length: "llama3" scaling: pre-training context length.
    sliding_window: Keys a local layer's query sees, itself included; 0 means
      every layer is global.
    global_layer_interval: Every this-many-th layer is global (see module
      docstring); 0 means none is.
    query_pre_attn_scalar: Queries are scaled by `query_pre_attn_scalar**-0.5`;
      None means `head_dim`.
    attn_logit_softcap: Attention logits become `c * tanh(logits / c)`; 0 is
      off.
    final_logit_softcap: Same for the output logits; 0 is off.
    mlp_activation: Gate activation of the MLP: "silu" or "gelu_tanh".
    remat_policy: What the backward pass of each block recomputes, by name
      (`maxtext.layers.remat`): "none" keeps every activation.
  """

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
  attention_impl: str = "reference"
  norm_eps: float = 1e-6
  norm_offset: float = 0.0
  post_norms: bool = False
  qk_norm: bool = False
  qkv_bias: bool = False
  scale_embeddings: bool = False
  rope_theta: float = 10_000.0
  rope_local_theta: float = 10_000.0
  rope_scaling: str = "default"
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_length: int = 8192
  sliding_window: int = 0
  global_layer_interval: int = 1
  query_pre_attn_scalar: float | None = None
  attn_logit_softcap: float = 0.0
  final_logit_softcap: float = 0.0
  mlp_activation: str = "silu"
  remat_policy: str = "none"

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    """Builds a config from a mapping (e.g. the `model` ConfigDict section).

    Raises:
      TypeError: a key is not a field (the error lists the valid fields).
    """
    if hasattr(values, "to_dict"):
      values = values.to_dict()
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
                 "qkv_bias", "scale_embeddings"):
      if not isinstance(getattr(self, name), bool):
        _fail(name, getattr(self, name), "must be True or False")
    for name, valid in (("dtype", DTYPES), ("param_dtype", DTYPES),
                        ("rope_scaling", ROPE_SCALINGS),
                        ("mlp_activation", MLP_ACTIVATIONS),
                        ("attention_impl", ATTENTION_IMPLS),
                        ("remat_policy", REMAT_POLICIES)):
      if getattr(self, name) not in valid:
        _fail(name, getattr(self, name), f"valid values are {valid}")
    for name in ("norm_eps", "rope_theta", "rope_local_theta"):
      if getattr(self, name) <= 0:
        _fail(name, getattr(self, name), "must be positive")
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
    if self.attention_impl == "xla" and self.attn_logit_softcap:
      _fail("attention_impl", self.attention_impl,
            "the xla implementation has no attention-logit soft-cap; use "
            '"reference" or set attn_logit_softcap=0')

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
    """Multiplier applied to queries before the dot product with keys."""
    scalar = self.query_pre_attn_scalar or self.head_dim
    return scalar**-0.5
