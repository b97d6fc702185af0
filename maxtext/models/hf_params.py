"""How our parameters are stored in Hugging Face checkpoints.

A model family lists one `ParamMap` per parameter: the parameter's path in
our model, its Hugging Face name and how the layouts differ. The generic
loader/exporter (`maxtext.models.hf_weights`) reads these lists. This module
also holds the entries several families share (norms, q/k norms, q/k/v
biases) and turns the Hugging Face config keys the Llama-style families share
(sizes, rotary settings, the local/global layer pattern) into `ModelConfig`
fields for each family's `model_config_from_hf`.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.layers import rope as rope_lib


@dataclasses.dataclass(frozen=True)
class ParamMap:
  """One parameter in our layout and in the Hugging Face layout.

  Attributes:
    path: Attribute path in our model (for per-layer entries, inside a block,
      e.g. ("attention", "query", "kernel")).
    hf_name: Hugging Face name; per-layer entries contain "{layer}".
    in_ndim: 0: the arrays are identical (up to `flatten`). n > 0: our
      kernel's first n axes are its inputs and Hugging Face stores the
      transpose of the [prod(inputs), prod(outputs)] matrix (a torch
      `Linear` weight).
    flatten: Hugging Face stores the array flattened to one axis (a torch
      `Linear` bias of our [heads, head_dim] bias).
    interleaved: Our last two axes [2, F] are one Hugging Face axis [2F]
      that alternates them: ours[..., c, f] = hf[..., 2f + c] (GPT-OSS's
      fused expert gate_up, gate at even and up at odd positions).
    halves: Our last two axes [2, F] are one Hugging Face axis [2F] that
      holds them one after the other: ours[..., c, f] = hf[..., c * F + f]
      (Llama 4's fused expert gate_up: gate, then up).
    swapped: Hugging Face stores our last two axes (after `halves` joins
      them) in the other order: per-expert torch `Linear` weights
      [experts, out, in] (Gemma 4's experts).
    permuted: Hugging Face stores `ours.transpose(permuted)` (a torch
      `Conv2d` weight [out, in, p, p] of our patch projection [p, p, in,
      out]: (3, 2, 0, 1)).
    conv1d: Hugging Face stores our [..., taps] (channels by the leading
      axes) as a torch depthwise `Conv1d` weight [channels, 1, taps].
    rows: (groups, start, stop): the parameter is part of a Hugging Face
      tensor that holds several: with that tensor's first axis (a torch
      `Linear` weight's outputs) viewed as [groups, n], its rows start ..
      stop - 1 of every group, laid out as above (Qwen3-Next's fused
      projections: per key head, its query, key, values and gates).
      `to_ours` takes the whole tensor, `to_hf` gives the part
      (`hf_weights` joins the parts).
  """

  path: tuple[str, ...]
  hf_name: str
  in_ndim: int = 0
  flatten: bool = False
  interleaved: bool = False
  halves: bool = False
  swapped: bool = False
  permuted: tuple[int, ...] | None = None
  conv1d: bool = False
  rows: tuple[int, int, int] | None = None

  def to_ours(self, hf_array: np.ndarray, shape: Sequence[int],
              name: str | None = None) -> np.ndarray:
    """Hugging Face array (named `name`, default `hf_name`) -> our layout of
    `shape`; ValueError naming both shapes if it has the wrong one."""
    if self.rows:
      groups, start, stop = self.rows
      if hf_array.ndim and hf_array.shape[0] % groups == 0:
        hf_array = hf_array.reshape(groups, -1, *hf_array.shape[1:])[
            :, start:stop].reshape(-1, *hf_array.shape[1:])
    if hf_array.shape != self.hf_shape(shape):
      raise ValueError(f"{name or self.hf_name}: shape {hf_array.shape} does not fit "
                       f"our parameter {'.'.join(self.path)} of shape "
                       f"{tuple(shape)} (expected Hugging Face shape "
                       f"{self.hf_shape(shape)}).")
    if self.permuted:
      return hf_array.transpose(np.argsort(self.permuted))
    if self.in_ndim:
      hf_array = hf_array.T
    if self.swapped:
      hf_array = hf_array.swapaxes(-1, -2)
    if self.interleaved:
      return hf_array.reshape(*shape[:-2], shape[-1], 2).swapaxes(-1, -2)
    return hf_array.reshape(shape)

  def hf_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """Hugging Face shape of our parameter of `shape`."""
    shape = tuple(shape)
    if self.conv1d:
      return (math.prod(shape[:-1]), 1, shape[-1])
    if self.permuted:
      return tuple(shape[axis] for axis in self.permuted)
    if self.in_ndim:
      return (math.prod(shape[self.in_ndim:]), math.prod(shape[:self.in_ndim]))
    if self.flatten:
      return (math.prod(shape),)
    if self.interleaved or self.halves:
      shape = (*shape[:-2], 2 * shape[-1])
    return (*shape[:-2], shape[-1], shape[-2]) if self.swapped else shape

  def to_hf(self, array: np.ndarray) -> np.ndarray:
    """Our array -> Hugging Face layout."""
    if self.conv1d:
      return array.reshape(self.hf_shape(array.shape))
    if self.permuted:
      return np.ascontiguousarray(array.transpose(self.permuted))
    if self.in_ndim:
      return array.reshape(math.prod(array.shape[:self.in_ndim]), -1).T
    if self.flatten:
      return array.reshape(-1)
    if self.interleaved:
      array = np.ascontiguousarray(array.swapaxes(-1, -2)).reshape(
          *array.shape[:-2], -1)
    elif self.halves:
      array = array.reshape(*array.shape[:-2], -1)
    return (np.ascontiguousarray(array.swapaxes(-1, -2)) if self.swapped
            else array)


def rope_fields(rope: Mapping[str, Any]) -> dict[str, Any]:
  """`ModelConfig` rope fields of a Hugging Face rope dict of global layers.

  Args:
    rope: Hugging Face `rope_parameters` (or legacy `rope_scaling` merged
      with `rope_theta`): keys rope_type, rope_theta, factor,
      low_freq_factor, high_freq_factor, original_max_position_embeddings,
      and for yarn beta_fast, beta_slow, truncate, mscale, mscale_all_dim.

  Raises:
    ValueError: an unsupported rope type, or a yarn `attention_factor`
      (only the one derived from factor and mscales is supported).
  """
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ("default", "linear", "llama3", "yarn"):
    raise ValueError(f"Unsupported Hugging Face rope_type {kind!r}; "
                     "supported: 'default', 'linear', 'llama3', 'yarn'.")
  fields = {"rope_theta": float(rope["rope_theta"]), "rope_scaling": kind}
  if kind != "default":
    fields["rope_scaling_factor"] = float(rope["factor"])
  if kind == "llama3":
    fields["rope_low_freq_factor"] = float(rope["low_freq_factor"])
    fields["rope_high_freq_factor"] = float(rope["high_freq_factor"])
  if kind in ("llama3", "yarn"):
    fields["rope_original_max_length"] = int(
        rope["original_max_position_embeddings"])
  if kind == "yarn":
    given = rope.get("attention_factor")
    derived = rope_lib.attention_factor(
        kind, float(rope["factor"]), float(rope.get("mscale") or 0.0),
        float(rope.get("mscale_all_dim") or 0.0))
    # Some configs state the default (OLMo 3); another value is refused.
    if given is not None and not math.isclose(given, derived, rel_tol=1e-6):
      raise ValueError(
          f"Unsupported yarn attention_factor={given}; only the default"
          f" derived from factor, mscale and mscale_all_dim ({derived}) is"
          " supported.")
    fields.update(
        rope_yarn_beta_fast=float(rope.get("beta_fast") or 32.0),
        rope_yarn_beta_slow=float(rope.get("beta_slow") or 1.0),
        rope_yarn_truncate=bool(rope.get("truncate", True)),
        rope_yarn_mscale=float(rope.get("mscale") or 0.0),
        rope_yarn_mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0))
  return fields


def rope_dict(hf: Mapping[str, Any]) -> Mapping[str, Any]:
  """The rope dict of a Hugging Face config with one set of rotary settings.

  `rope_parameters` (transformers >= 5), or the legacy `config.json` keys
  `rope_scaling` merged with `rope_theta`.
  """
  if hf.get("rope_parameters"):
    return hf["rope_parameters"]
  return {**(hf.get("rope_scaling") or {}), "rope_theta": hf["rope_theta"]}


def decoder_fields(hf: Mapping[str, Any], *,
                   tie_embeddings_default: bool) -> dict[str, Any]:
  """`ModelConfig` sizes, norm epsilon and rotary fields of a HF config.

  Shared by the Llama-style configs (Llama, Mistral, Gemma, Qwen): keys
  vocab_size, num_hidden_layers, hidden_size, intermediate_size,
  num_attention_heads, num_key_value_heads, head_dim (absent or None means
  hidden_size // num_attention_heads), tie_word_embeddings (absent means
  `tie_embeddings_default`), rms_norm_eps and the rope keys of `rope_dict`.
  """
  num_heads = hf["num_attention_heads"]
  return dict(
      vocab_size=hf["vocab_size"],
      num_layers=hf["num_hidden_layers"],
      embed_dim=hf["hidden_size"],
      mlp_dim=hf["intermediate_size"],
      num_heads=num_heads,
      num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
      tie_embeddings=hf.get("tie_word_embeddings", tie_embeddings_default),
      norm_eps=hf["rms_norm_eps"],
      **rope_fields(rope_dict(hf)),
  )


def hf_rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `rope_parameters` of global layers (inverse of
  `rope_fields`)."""
  rope = {"rope_type": cfg.rope.scaling, "rope_theta": cfg.rope.theta}
  if cfg.rope.scaling != "default":
    rope["factor"] = cfg.rope.scaling_factor
  if cfg.rope.scaling == "llama3":
    rope["low_freq_factor"] = cfg.rope.low_freq_factor
    rope["high_freq_factor"] = cfg.rope.high_freq_factor
  if cfg.rope.scaling in ("llama3", "yarn"):
    rope["original_max_position_embeddings"] = cfg.rope.original_max_length
  if cfg.rope.scaling == "yarn":
    rope.update(beta_fast=cfg.rope.yarn_beta_fast,
                beta_slow=cfg.rope.yarn_beta_slow,
                truncate=cfg.rope.yarn_truncate)
    if cfg.rope.yarn_mscale:
      rope["mscale"] = cfg.rope.yarn_mscale
    if cfg.rope.yarn_mscale_all_dim:
      rope["mscale_all_dim"] = cfg.rope.yarn_mscale_all_dim
  return rope


def decoder_hf_config(cfg: ModelConfig, *, model_type: str,
                      architecture: str) -> dict[str, Any]:
  """`config.json` keys of `decoder_fields` for `cfg` (its inverse).

  Also sets model_type, architectures and dtype (the parameter dtype); a
  family adds its own keys. transformers >= 5 reads `rope_parameters`.
  """
  config = dict(
      architectures=[architecture],
      model_type=model_type,
      vocab_size=cfg.vocab_size,
      num_hidden_layers=cfg.num_layers,
      hidden_size=cfg.embed_dim,
      intermediate_size=cfg.mlp.dim,
      num_attention_heads=cfg.attention.num_heads,
      num_key_value_heads=cfg.attention.num_kv_heads,
      head_dim=cfg.attention.head_dim,
      tie_word_embeddings=cfg.tie_embeddings,
      rms_norm_eps=cfg.norm.eps,
      rope_parameters=hf_rope_parameters(cfg),
      dtype=cfg.param_dtype,
  )
  if cfg.rope.scaling == "llama3":
    config["max_position_embeddings"] = int(
        cfg.rope.original_max_length * cfg.rope.scaling_factor)
  return config


def hf_layer_types(cfg: ModelConfig) -> list[str]:
  """Hugging Face `layer_types` of `cfg`'s local/global layer pattern."""
  return ["full_attention" if window is None else "sliding_attention"
          for window in cfg.layer_windows()]


def global_layer_interval(layer_types: Sequence[str]) -> int:
  """`ModelConfig.global_layer_interval` of Hugging Face `layer_types`.

  Raises:
    ValueError: the layers are not one "full_attention" layer every N, the
      others "sliding_attention".
  """
  layer_types = list(layer_types)
  if "full_attention" not in layer_types:
    return 0
  interval = layer_types.index("full_attention") + 1
  expected = ["full_attention" if (i + 1) % interval == 0 else
              "sliding_attention" for i in range(len(layer_types))]
  if layer_types != expected:
    raise ValueError(f"layer_types {layer_types} are not one global layer "
                     "every N layers.")
  return interval


def _block(hf_suffix: str) -> str:
  return "model.layers.{layer}." + hf_suffix


# Names shared by Hugging Face's Llama-style decoders (Llama, Gemma, ...).
COMMON_PARAMS = (
    ParamMap(("embedder", "embedding"), "model.embed_tokens.weight"),
    ParamMap(("final_norm", "scale"), "model.norm.weight"),
    ParamMap(("head", "kernel"), "lm_head.weight", in_ndim=1),
)
COMMON_BLOCK_PARAMS = (
    ParamMap(("pre_attention_norm", "scale"), _block("input_layernorm.weight")),
    ParamMap(("attention", "query", "kernel"),
             _block("self_attn.q_proj.weight"), in_ndim=1),
    ParamMap(("attention", "key", "kernel"),
             _block("self_attn.k_proj.weight"), in_ndim=1),
    ParamMap(("attention", "value", "kernel"),
             _block("self_attn.v_proj.weight"), in_ndim=1),
    ParamMap(("attention", "output", "kernel"),
             _block("self_attn.o_proj.weight"), in_ndim=2),
    ParamMap(("mlp", "gate", "kernel"), _block("mlp.gate_proj.weight"),
             in_ndim=1),
    ParamMap(("mlp", "up", "kernel"), _block("mlp.up_proj.weight"), in_ndim=1),
    ParamMap(("mlp", "down", "kernel"), _block("mlp.down_proj.weight"),
             in_ndim=1),
)


def block_param(path: tuple[str, ...], hf_suffix: str, *,
                flatten: bool = False, interleaved: bool = False,
                halves: bool = False, swapped: bool = False,
                in_ndim: int = 0, conv1d: bool = False,
                rows: tuple[int, int, int] | None = None) -> ParamMap:
  """A per-layer entry, e.g. a norm scale or a bias (`in_ndim` > 0: a
  torch `Linear` weight)."""
  return ParamMap(path, _block(hf_suffix), in_ndim=in_ndim, flatten=flatten,
                  interleaved=interleaved, halves=halves, swapped=swapped,
                  conv1d=conv1d, rows=rows)


# Llama's "post_attention_layernorm" normalises the MLP input (so do Mistral,
# Gemma 1 and Qwen); Gemma 2 and 3 name it "pre_feedforward_layernorm".
PRE_MLP_NORM = block_param(("pre_mlp_norm", "scale"),
                           "post_attention_layernorm.weight")
# The norms of attention's and the MLP's outputs (Gemma 2 and 3, OLMo).
POST_ATTENTION_NORM = block_param(("post_attention_norm", "scale"),
                                  "post_attention_layernorm.weight")
POST_MLP_NORM = block_param(("post_mlp_norm", "scale"),
                            "post_feedforward_layernorm.weight")
# Gemma 2 and 3 normalise both block inputs and both block outputs.
SANDWICH_NORMS = (
    POST_ATTENTION_NORM,
    block_param(("pre_mlp_norm", "scale"), "pre_feedforward_layernorm.weight"),
    POST_MLP_NORM,
)
QK_NORMS = (
    block_param(("attention", "query_norm", "scale"),
                "self_attn.q_norm.weight"),
    block_param(("attention", "key_norm", "scale"), "self_attn.k_norm.weight"),
)
QKV_BIASES = (
    block_param(("attention", "query", "bias"), "self_attn.q_proj.bias",
                flatten=True),
    block_param(("attention", "key", "bias"), "self_attn.k_proj.bias",
                flatten=True),
    block_param(("attention", "value", "bias"), "self_attn.v_proj.bias",
                flatten=True),
)


def expert_params(moe_prefix: str, router: str, gate: str, up: str,
                  down: str) -> tuple[ParamMap, ...]:
  """Entries of a mixture-of-experts layer (`maxtext.layers.moe.MoE`).

  Hugging Face checkpoints store the router as `{moe_prefix}.{router}.weight`
  and expert j's projections as `{moe_prefix}.experts.j.{gate|up|down}.weight`
  (torch `Linear` weights; transformers >= 5 fuses them only in memory).
  """
  def expert(path, name):
    return ParamMap(("moe", path),
                    _block(f"{moe_prefix}.experts.{{{{expert}}}}.{name}.weight"),
                    in_ndim=1)

  return (
      ParamMap(("moe", "router", "kernel"),
               _block(f"{moe_prefix}.{router}.weight"), in_ndim=1),
      expert("gate", gate),
      expert("up", up),
      expert("down", down),
  )


def hf_query_pre_attn_scalar(cfg: ModelConfig) -> int | float:
  """`query_pre_attn_scalar` as Hugging Face configs store it (an int when whole)."""
  scalar = cfg.attention.query_pre_attn_scalar or cfg.attention.head_dim
  return int(scalar) if float(scalar).is_integer() else scalar
