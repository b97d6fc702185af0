"""How our parameters are stored in Hugging Face checkpoints.

A model family lists one `ParamMap` per parameter: the parameter's path in
our model, its Hugging Face name and how the layouts differ. The generic
loader/exporter (`maxtext.models.hf_weights`) reads these lists; this module
also turns Hugging Face rotary settings into `ModelConfig` fields, which every
family's `model_config_from_hf` shares.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class ParamMap:
  """One parameter in our layout and in the Hugging Face layout.

  Attributes:
    path: Attribute path in our model (for per-layer entries, inside a block,
      e.g. ("attention", "query", "kernel")).
    hf_name: Hugging Face name; per-layer entries contain "{layer}".
    in_ndim: 0: the arrays are identical. n > 0: our kernel's first n axes
      are its inputs and Hugging Face stores the transpose of the
      [prod(inputs), prod(outputs)] matrix (a torch `Linear` weight).
  """

  path: tuple[str, ...]
  hf_name: str
  in_ndim: int = 0

  def to_ours(self, hf_array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Hugging Face array -> our layout of `shape`."""
    if self.in_ndim:
      hf_array = hf_array.T
    if hf_array.size != math.prod(shape):
      raise ValueError(f"{self.hf_name}: shape {hf_array.shape} does not fit "
                       f"our parameter {'.'.join(self.path)} of shape "
                       f"{tuple(shape)}.")
    return hf_array.reshape(shape)

  def to_hf(self, array: np.ndarray) -> np.ndarray:
    """Our array -> Hugging Face layout."""
    if self.in_ndim:
      return array.reshape(math.prod(array.shape[:self.in_ndim]), -1).T
    return array


def rope_fields(rope: Mapping[str, Any]) -> dict[str, Any]:
  """`ModelConfig` rope fields of a Hugging Face rope dict of global layers.

  Args:
    rope: Hugging Face `rope_parameters` (or legacy `rope_scaling` merged
      with `rope_theta`): keys rope_type, rope_theta, factor,
      low_freq_factor, high_freq_factor, original_max_position_embeddings.

  Raises:
    ValueError: an unsupported rope type.
  """
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ("default", "linear", "llama3"):
    raise ValueError(f"Unsupported Hugging Face rope_type {kind!r}; "
                     "supported: 'default', 'linear', 'llama3'.")
  fields = {"rope_theta": float(rope["rope_theta"]), "rope_scaling": kind}
  if kind != "default":
    fields["rope_scaling_factor"] = float(rope["factor"])
  if kind == "llama3":
    fields["rope_low_freq_factor"] = float(rope["low_freq_factor"])
    fields["rope_high_freq_factor"] = float(rope["high_freq_factor"])
    fields["rope_original_max_length"] = int(
        rope["original_max_position_embeddings"])
  return fields


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


def block_param(path: tuple[str, ...], hf_suffix: str) -> ParamMap:
  """A per-layer identity-layout entry, e.g. a norm scale."""
  return ParamMap(path, _block(hf_suffix))
