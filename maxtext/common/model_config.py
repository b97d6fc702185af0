"""`ModelConfig`: the typed, validated description of a decoder.

Built once at the boundary from the `model` section of a config file:

  cfg = ModelConfig.from_dict(config.model)

The `model` section is flat (`num_heads`, `rope_theta`, `num_experts`, ...:
`keys()` lists them); `ModelConfig` groups them into small frozen parts,
each defined, documented and validated next to the code that reads it, and
each layer receives only its own part:

  attention  `maxtext.layers.attention.AttentionConfig`  (num_heads, ...)
  rope       `maxtext.layers.rope.RopeConfig`            (rope_*)
  norm       `maxtext.layers.norm.NormConfig`            (norm_*)
  mlp        `maxtext.layers.mlp.MlpConfig`              (mlp_*)
  moe        `maxtext.layers.moe.MoeConfig`              (experts, router)
  mla        `maxtext.layers.mla.MlaConfig`              (latent sizes)
  mtp        `maxtext.models.mtp.MtpConfig`              (mtp_*)
  pattern    `maxtext.common.layer_pattern.PatternConfig` (which layers are
             local or global, dense or experts)
  vision     `maxtext.layers.vision.VisionConfig`        (vision_*: the
             vision tower of a vision-language model, none by default)
  linear_attention
             `maxtext.layers.gated_deltanet.LinearAttentionConfig`
             (linear_*: Gated DeltaNet layers, none by default)

Each part's `KEYS` maps its fields to their section keys; an invalid value
is reported under its key ("ModelConfig.rope_theta=-1.0 is invalid: ...").
What involves two parts (MLA's heads, the expert layers of the pattern) is
checked here (`maxtext.common.model_checks`). How a model runs (kernels,
pipeline, remat) is not architecture: `maxtext.models.execution`.

Shared code reads these fields and never branches on `family`.
"""

from collections.abc import Iterator, Mapping
import dataclasses
import typing
from typing import Any, ClassVar

from maxtext.common import layer_pattern as pattern_lib
from maxtext.common import model_checks
from maxtext.common import sections
from maxtext.layers import attention as attention_lib
from maxtext.layers import gated_deltanet as gated_deltanet_lib
from maxtext.layers import mla as mla_lib
from maxtext.layers import mlp as mlp_lib
from maxtext.layers import moe as moe_lib
from maxtext.layers import norm as norm_lib
from maxtext.layers import rope as rope_lib
from maxtext.layers import vision as vision_lib
from maxtext.models import mtp as mtp_lib

DTYPES = ("float32", "bfloat16")
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
# The parts of a model: `ModelConfig` field -> its class.
PARTS = {
    "attention": attention_lib.AttentionConfig,
    "rope": rope_lib.RopeConfig,
    "norm": norm_lib.NormConfig,
    "mlp": mlp_lib.MlpConfig,
    "moe": moe_lib.MoeConfig,
    "mla": mla_lib.MlaConfig,
    "mtp": mtp_lib.MtpConfig,
    "pattern": pattern_lib.PatternConfig,
    "vision": vision_lib.VisionConfig,
    "linear_attention": gated_deltanet_lib.LinearAttentionConfig,
}


def migrate(values: Mapping[str, Any]) -> dict[str, Any]:
  """The `model` section of a mapping written by an earlier version (a
  converted checkpoint's `model_config.json`, a workdir's `config.json`):
  the keys that moved out (`MOVED_KEYS`) recorded how that run ran, not the
  model, and are dropped."""
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
    attention, rope, norm, mlp, moe, mla, mtp, pattern, vision,
      linear_attention: The parts (module doc).
    tie_embeddings: The output head reuses the token embedding.
    dtype: Compute dtype name.
    param_dtype: Parameter dtype name.
    scan_layers: Stack the blocks' parameters and run them with a scan, so
      compile time does not grow with depth.
    pre_norms: Normalise the inputs of attention and MLP (pre-norm); off
      with `post_norms` only (OLMo 2/3).
    post_norms: Also normalise the outputs of attention and MLP before the
      residual add (Gemma 2/3 "sandwich" norms).
    scale_embeddings: Multiply token embeddings by sqrt(embed_dim).
    final_logit_softcap: The output logits become `c * tanh(logits / c)`;
      0 is off.
    layer_scalar: Each block multiplies its output, the whole residual
      stream, by a scalar parameter of its own (Gemma 4's layer_scalar;
      initialised to 1).
    per_layer_input_dim: Width P of each layer's own input (Gemma 4 e2b and
      e4b's per-layer embeddings; 0: none): a token embedding of width
      num_layers * P (times sqrt(P)) plus a projection of the embedded
      tokens (times embed_dim^-1/2, then RMS-normalised over each layer's
      P), times 2^-1/2. After its MLP each block adds
      `post_norm(project(unit(gate(x), input)))`, `unit` the MLP's gated
      unit (`maxtext.models.block`).
  """

  # Keys moved to other sections (`sections.build_section` names them).
  MOVED_KEYS: ClassVar[dict[str, str]] = MOVED_KEYS

  family: str
  vocab_size: int
  num_layers: int
  embed_dim: int
  attention: attention_lib.AttentionConfig
  mlp: mlp_lib.MlpConfig
  rope: rope_lib.RopeConfig = dataclasses.field(
      default_factory=rope_lib.RopeConfig)
  norm: norm_lib.NormConfig = dataclasses.field(
      default_factory=norm_lib.NormConfig)
  moe: moe_lib.MoeConfig = dataclasses.field(default_factory=moe_lib.MoeConfig)
  mla: mla_lib.MlaConfig = dataclasses.field(default_factory=mla_lib.MlaConfig)
  mtp: mtp_lib.MtpConfig = dataclasses.field(default_factory=mtp_lib.MtpConfig)
  pattern: pattern_lib.PatternConfig = dataclasses.field(
      default_factory=pattern_lib.PatternConfig)
  vision: vision_lib.VisionConfig = dataclasses.field(
      default_factory=vision_lib.VisionConfig)
  linear_attention: gated_deltanet_lib.LinearAttentionConfig = (
      dataclasses.field(
          default_factory=gated_deltanet_lib.LinearAttentionConfig))
  tie_embeddings: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = True
  pre_norms: bool = True
  post_norms: bool = False
  scale_embeddings: bool = False
  final_logit_softcap: float = 0.0
  layer_scalar: bool = False
  per_layer_input_dim: int = 0

  @classmethod
  def _flat_fields(cls) -> Iterator[tuple[str, Any, dataclasses.Field]]:
    """(key of the flat `model` section, its type, its dataclass field) of
    every top-level field and every part's field, in field order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
      part = PARTS.get(f.name)
      if part is None:
        yield f.name, hints[f.name], f
        continue
      part_hints = typing.get_type_hints(part)
      for g in dataclasses.fields(part):
        yield part.KEYS[g.name], part_hints[g.name], g

  @classmethod
  def section_schema(cls) -> dict[str, tuple[Any, bool]]:
    """{key of the flat `model` section: (its type, whether required)}, in
    field order (`sections.build_section` checks a section against it)."""
    return {key: (hint, f.default is dataclasses.MISSING and
                  f.default_factory is dataclasses.MISSING)
            for key, hint, f in cls._flat_fields()}

  @classmethod
  def keys(cls) -> dict[str, Any]:
    """{key of the flat `model` section: its default (None for the keys a
    family must set)}."""
    return {key: None if f.default is dataclasses.MISSING else f.default
            for key, _, f in cls._flat_fields()}

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    """Builds a config from the flat `model` section (a mapping, e.g. the
    ConfigDict section, or what `to_dict` wrote).

    Raises:
      TypeError: a key is unknown (the error lists the valid ones) or a
        required one is missing.
      ValueError: a key moved out of the model (`MOVED_KEYS`), or a value
        is invalid (named by its key), a NaN or infinite float included.
    """
    if hasattr(values, "to_dict"):
      values = values.to_dict()
    sections.check_moved("model", cls, values)
    valid = list(cls.section_schema())
    unknown = sorted(set(values) - set(valid))
    if unknown:
      raise TypeError(
          f"Unknown ModelConfig field(s) {unknown}; valid fields: {valid}.")
    sections.check_finite("model", values)
    part_keys = {key for part in PARTS.values() for key in part.KEYS.values()}
    top = {key: value for key, value in values.items()
           if key not in part_keys}
    for name, part in PARTS.items():
      top[name] = part(**{field: values[key]
                          for field, key in part.KEYS.items()
                          if key in values})
    return cls(**top)

  def to_dict(self) -> dict[str, Any]:
    """The flat `model` section of this config (`from_dict` reads it)."""
    values = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name in PARTS:
        values.update({key: getattr(value, field)
                       for field, key in PARTS[f.name].KEYS.items()})
      else:
        values[f.name] = value
    return values

  def replace(self, **changes: Any) -> "ModelConfig":
    """This config with `changes` (keys of the flat `model` section,
    e.g. `num_experts=0`), validated again."""
    return type(self).from_dict({**self.to_dict(), **changes})

  def __post_init__(self):
    if not self.family:
      _fail("family", self.family, "must be a non-empty family name")
    for name in ("vocab_size", "num_layers", "embed_dim"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(name, value, "must be a positive integer")
    for name in ("tie_embeddings", "scan_layers", "pre_norms", "post_norms",
                 "scale_embeddings", "layer_scalar"):
      if not isinstance(getattr(self, name), bool):
        _fail(name, getattr(self, name), "must be True or False")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in DTYPES:
        _fail(name, getattr(self, name), f"valid values are {DTYPES}")
    if isinstance(self.per_layer_input_dim, bool) or not isinstance(
        self.per_layer_input_dim, int) or self.per_layer_input_dim < 0:
      _fail("per_layer_input_dim", self.per_layer_input_dim,
            "must be an integer >= 0 (0 turns it off)")
    if self.final_logit_softcap < 0:
      _fail("final_logit_softcap", self.final_logit_softcap,
            "must be >= 0 (0 turns it off)")
    for name, part in PARTS.items():
      if not isinstance(getattr(self, name), part):
        _fail(name, getattr(self, name), f"must be a {part.__name__}")
    if not (self.pre_norms or self.post_norms):
      _fail("pre_norms", self.pre_norms,
            "may be False only with post_norms=True (a block needs norms)")
    model_checks.check_expert_layers(self)
    model_checks.check_global_sizes(self)
    model_checks.check_nope(self)
    model_checks.check_mla(self)
    model_checks.check_kv_sharing(self)
    model_checks.check_vision(self)
    model_checks.check_linear_attention(self)
    model_checks.check_partial_rotary(self)

  def moe_layer(self, layer: int) -> bool:
    """Whether layer `layer` (0-based) has experts instead of a dense MLP."""
    return self.pattern.moe_layer(layer, self.moe.num_experts)

  def layer_windows(self) -> tuple[int | None, ...]:
    """Sliding window of each layer; None for a global layer."""
    return self.pattern.windows(self.num_layers)

  @property
  def query_scale(self) -> float:
    """Multiplier applied to queries before the dot product with keys
    (with MLA, their width is qk_nope_head_dim + head_dim)."""
    return self.attention.query_scale(self.attention.head_dim +
                                      self.mla.qk_nope_head_dim)
