"""Hugging Face weights <-> our decoder, for every family and both layouts.

`load_hf_weights(model, state_dict)` copies a Hugging Face state dict (name ->
numpy array, e.g. from safetensors) into a model built by
`registry.create_model` (or an abstract one from `nnx.eval_shape`, filled
tensor by tensor); `to_hf_weights(model)` is the inverse, and
`iter_hf_weights(model)` yields the same tensors one at a time. Names and
layouts come from the family's `HF_PARAMS` (whole-model parameters) and
`HF_BLOCK_PARAMS` (per layer, "{layer}" in the name); both the scanned
layout (parameters stacked over layers) and the unscanned one (a list of
blocks) are handled here. A name that also holds "{{expert}}" (escaped, so
it survives the layer's `format`) is one Hugging Face tensor per expert of a
parameter whose (next) leading axis is the expert (mixture of experts).

The loader takes numpy arrays of any floating dtype (float16, bfloat16,
float32, float64) and casts them to each parameter's dtype; torch tensors are
converted by the caller (`tensor.float().numpy()` for bfloat16, which numpy
lacks). Multimodal checkpoints (Gemma 3 `*ForConditionalGeneration`) load
their text decoder: names under `model.language_model.` (transformers >= 4.52)
or `language_model.` (earlier: `language_model.model.*`,
`language_model.lm_head.weight`) are renamed to the text-only names, a
top-level `lm_head.weight` is kept (absent when tied), and the other weights
(vision tower, projector) are skipped; their count is logged.
"""

from collections.abc import Iterable, Iterator, Mapping

from absl import logging
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maxtext.models import hf_params
from maxtext.models import registry


def _variable(node, path: tuple[str, ...]) -> nnx.Variable | None:
  """The variable at `path` under `node`; None if the model has none there."""
  for name in path:
    node = getattr(node, name, None)
    if node is None:
      return None
  return node


def _entries(model: nnx.Module) -> Iterator[
    tuple[hf_params.ParamMap, nnx.Variable, int | None]]:
  """(entry, variable, layer) for each parameter of `model` with a HF name.

  `layer` is None for whole-model parameters and for stacked (scanned)
  per-layer parameters, whose leading axis is the layer.
  """
  family = registry.family_module(model.cfg.family)
  for entry in family.HF_PARAMS:
    variable = _variable(model, entry.path)
    if variable is not None:
      yield entry, variable, None
  if model.cfg.scan_layers:
    blocks = [(model.blocks, None)]
  else:
    blocks = [(block, layer) for layer, block in enumerate(model.blocks)]
  for entry in family.HF_BLOCK_PARAMS:
    for block, layer in blocks:
      variable = _variable(block, entry.path)
      if variable is not None:
        yield entry, variable, layer


def _names(entry: hf_params.ParamMap, num_layers: int) -> list[str]:
  if "{layer}" in entry.hf_name:
    return [entry.hf_name.format(layer=i) for i in range(num_layers)]
  return [entry.hf_name]


# Prefixes of a multimodal checkpoint's text decoder -> text-only prefix.
_LANGUAGE_MODEL_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.", ""),
)


def _text_decoder_names(names: Iterable[str]) -> dict[str, str]:
  """{text-only name: name in the state dict}; a multimodal checkpoint loses
  its vision weights. Only names are read, so a lazy state dict stays lazy.

  Raises:
    ValueError: two names map to the same text-only name.
  """
  names = list(names)
  renamed = {}
  for name in names:
    for prefix, replacement in _LANGUAGE_MODEL_PREFIXES:
      if name.startswith(prefix):
        renamed[name] = replacement + name[len(prefix):]
        break
  if not renamed:
    return {name: name for name in names}
  # Multimodal: keep the language model and the output head only.
  text = {}
  for name in names:
    if name not in renamed and name != "lm_head.weight":
      continue
    text_name = renamed.get(name, name)
    if text_name in text:
      raise ValueError(f"Hugging Face weights {name!r} and another weight "
                       f"both map to {text_name!r}.")
    text[text_name] = name
  logging.info("Multimodal checkpoint: loading its text decoder (%d weights), "
               "skipping %d other weights (vision tower, projector).",
               len(text), len(names) - len(text))
  return text


def _float_array(name: str, value) -> np.ndarray:
  """`value` as a numpy array; TypeError unless it is floating point."""
  try:
    array = np.asarray(value)
  except (TypeError, RuntimeError) as error:
    raise TypeError(
        f"Hugging Face weight {name!r} ({type(value).__name__}) is not a "
        "numpy array; convert torch tensors with tensor.float().numpy() "
        f"({error}).") from error
  if not jnp.issubdtype(array.dtype, jnp.floating):
    raise TypeError(f"Hugging Face weight {name!r} has dtype {array.dtype}; "
                    "expected a floating-point array.")
  return array


def load_hf_weights(model: nnx.Module,
                    state_dict: Mapping[str, np.ndarray]) -> None:
  """Overwrites `model`'s parameters with Hugging Face weights, in place.

  Args:
    model: A model from `registry.create_model`.
    state_dict: Hugging Face parameter name -> numpy array of any floating
      dtype (cast to the parameter's dtype). Names of a multimodal
      checkpoint's language model are understood (see module docstring).

  Raises:
    KeyError: a weight the model needs is missing.
    TypeError: a weight is not a floating-point numpy array.
    ValueError: a weight has the wrong size, or the state dict has weights
      the model has no place for.
  """
  names = _text_decoder_names(state_dict)
  used = set()

  def fetch(entry, name, shape):
    if "{expert}" in name:
      return np.stack([fetch(entry, name.format(expert=expert), shape[1:])
                       for expert in range(shape[0])])
    if name not in names:
      raise KeyError(f"Hugging Face weight {name!r} is missing (needed for "
                     f"{'.'.join(entry.path)}).")
    used.add(name)
    return entry.to_ours(_float_array(name, state_dict[names[name]]), shape,
                         name)

  num_layers = model.cfg.num_layers
  for entry, variable, layer in _entries(model):
    if layer is not None:
      value = fetch(entry, entry.hf_name.format(layer=layer), variable.shape)
    elif "{layer}" in entry.hf_name:
      # Filled layer by layer: one stacked copy, not a list plus a stack.
      value = np.empty(variable.shape, variable.dtype)
      for i, name in enumerate(_names(entry, num_layers)):
        value[i] = fetch(entry, name, variable.shape[1:])
    else:
      value = fetch(entry, entry.hf_name, variable.shape)
    # Replaces the value, so an abstract model (`nnx.eval_shape`) fills too.
    variable.value = jnp.asarray(value, variable.dtype)
  family = registry.family_module(model.cfg.family)
  known = {entry.hf_name for entry in family.HF_PARAMS}
  # Weights of parameters this configuration lacks (a tied model's lm_head)
  # are ignored; anything else left over means a mapping is missing.
  unexpected = sorted(set(names) - used - known)
  if unexpected:
    raise ValueError(f"Hugging Face weights with no place in the "
                     f"{model.cfg.family} model: {unexpected}.")


def iter_hf_weights(model: nnx.Module) -> Iterator[tuple[str, np.ndarray]]:
  """Yields `model`'s parameters as (Hugging Face name, numpy array), one at
  a time, so a writer can store each before the next is made."""
  num_layers = model.cfg.num_layers

  def tensors(entry, name, array):
    if "{expert}" not in name:
      return [(name, entry.to_hf(array))]
    return [(name.format(expert=expert), entry.to_hf(expert_array))
            for expert, expert_array in enumerate(array)]

  for entry, variable, layer in _entries(model):
    array = np.asarray(variable[...])
    if layer is not None:
      yield from tensors(entry, entry.hf_name.format(layer=layer), array)
    elif "{layer}" in entry.hf_name:
      for name, layer_array in zip(_names(entry, num_layers), array):
        yield from tensors(entry, name, layer_array)
    else:
      yield from tensors(entry, entry.hf_name, array)


def to_hf_weights(model: nnx.Module) -> dict[str, np.ndarray]:
  """Returns `model`'s parameters as a Hugging Face state dict (numpy)."""
  return dict(iter_hf_weights(model))
