"""Hugging Face weights <-> our decoder, for every family and both layouts.

`load_hf_weights(model, state_dict)` copies a Hugging Face state dict (name ->
numpy array, e.g. from safetensors) into a model built by
`registry.create_model` (or an abstract one from `nnx.eval_shape`, filled
tensor by tensor); `to_hf_weights(model)` is the inverse, and
`iter_hf_weights(model)` yields the same tensors one at a time. Names and
layouts come from the family's `HF_PARAMS` (whole-model parameters) and
`HF_BLOCK_PARAMS` (per layer, "{layer}" in the name); both the scanned layout
(parameters stacked over layers) and the unscanned one (a list of blocks) are
handled here. Each layer kind's stack holds the Hugging Face layers of that
kind, in order (`layer_pattern.kind_layers`: e.g. DeepSeek's dense first layers
are its `dense_blocks`). Multi-token prediction modules (`model.mtp`,
DeepSeek-V3) are Hugging Face layers num_layers + k for depth k + 1, named by
the family's `HF_MTP_PARAMS`; their copies of the embedding and output head
(`HF_MTP_COPIES`) are skipped on load and written on export. A checkpoint's
prediction layers that the model lacks (mtp_layers=0) are skipped, and their
count logged. A name that also holds "{{expert}}" (escaped, so it survives the
layer's `format`) is one Hugging Face tensor per expert of a parameter whose
(next) leading axis is the expert (mixture of experts).

The loader takes numpy arrays of any floating dtype (float16, bfloat16,
float32, float64) and casts them to each parameter's dtype; torch tensors are
converted by the caller (`tensor.float().numpy()` for bfloat16, which numpy
lacks). Multimodal checkpoints (`*ForConditionalGeneration`) load their text
decoder: names under `model.language_model.` (transformers >= 4.52) or
`language_model.` (earlier, and how transformers 5 saves them:
`language_model.model.*`, `language_model.lm_head.weight`) are renamed to
the text-only names and a top-level `lm_head.weight` is kept (absent when
tied). A model with a vision tower (`model.vision`) also loads the tower and
projector from the family's `HF_VISION_PARAMS` and, per encoder layer,
`HF_VISION_LAYER_PARAMS` (names under `vision_tower.` or
`multi_modal_projector.`, with or without `model.`, SigLIP's older
`vision_model.` level dropped), and exports the whole checkpoint as
transformers 5 saves it (`hf_name`); for a model without one the vision
weights are skipped and their count is logged. So are the
weights a family's `hf_skipped_weights(cfg)` names and those under its
`HF_SKIPPED_PREFIXES` (checkpoint weights its reference implementation
ignores too, e.g. Qwen3-Next's multi-token prediction module).
"""

import collections
from collections.abc import Iterable, Iterator, Mapping

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.models import execution as execution_lib
from maxtext.models import hf_params
from maxtext.models import registry


def _variable(node, path: tuple[str, ...]) -> nnx.Variable | None:
  """The variable at `path` under `node`; None if the model has none there."""
  for name in path:
    node = getattr(node, name, None)
    if node is None:
      return None
  return node


def _block_stacks(model: nnx.Module) -> list[tuple[object, tuple[int, ...]]]:
  """(block stack, its Hugging Face layers) of each layer kind."""
  return [(getattr(model, name), layers)
          for name, layers in layer_pattern.kind_layers(model.cfg).items()]


def _entries(model: nnx.Module) -> Iterator[
    tuple[hf_params.ParamMap, nnx.Variable, int | range | None]]:
  """(entry, variable, layers) for each parameter of `model` with a HF name.

  `layers` is None for whole-model parameters, the Hugging Face layer of a
  per-layer parameter, or the layers of a stacked (scanned) one,
  whose leading axis is the layer.
  """
  family = registry.family_module(model.cfg.family)
  for entry in family.HF_PARAMS:
    variable = _variable(model, entry.path)
    if variable is not None:
      yield entry, variable, None
  blocks = []
  for stack, layers in _block_stacks(model):
    if model.cfg.scan_layers:
      blocks.append((stack, layers))
    else:
      blocks.extend(zip(stack, layers))
  for entry in registry.hf_block_params(model.cfg):
    for block, layers in blocks:
      variable = _variable(block, entry.path)
      if variable is not None:
        yield entry, variable, layers
  tower = getattr(model, "vision", None)
  if tower is not None:
    for entry in family.HF_VISION_PARAMS:
      yield entry, _variable(model, entry.path), None
    layers = range(model.cfg.vision.layers)
    stacks = ([(tower.layers, layers)] if model.cfg.scan_layers
              else list(zip(tower.layers, layers)))
    for entry in family.HF_VISION_LAYER_PARAMS:
      for stack, stack_layers in stacks:
        yield entry, _variable(stack, entry.path), stack_layers
  for depth, module in enumerate(getattr(model, "mtp", None) or ()):
    for entry in family.HF_MTP_PARAMS:
      variable = _variable(module, entry.path)
      if variable is not None:
        yield entry, variable, model.cfg.num_layers + depth


def _mtp_copies(model: nnx.Module) -> Iterator[
    tuple[str, hf_params.ParamMap, nnx.Variable]]:
  """(HF name, whole-model entry, its variable) of each prediction module's
  copies of shared parameters (embedding, output head)."""
  family = registry.family_module(model.cfg.family)
  for depth in range(len(getattr(model, "mtp", None) or ())):
    for name, entry in getattr(family, "HF_MTP_COPIES", ()):
      variable = _variable(model, entry.path)
      if variable is not None:
        yield (name.format(layer=model.cfg.num_layers + depth), entry,
               variable)


def _layer_of(name: str) -> int | None:
  """The layer index of a `model.layers.{i}.*` name, else None."""
  prefix = "model.layers."
  if not name.startswith(prefix):
    return None
  index = name[len(prefix):].split(".", 1)[0]
  return int(index) if index.isdigit() else None


# Prefixes of a multimodal checkpoint's text decoder -> text-only prefix.
_LANGUAGE_MODEL_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.", ""),
)
# transformers 5's modules of a multimodal model's vision weights: the names
# our mappings use.
_TOWER, _PROJECTOR = "model.vision_tower.", "model.multi_modal_projector."
# Prefixes of those weights -> ours: our own, and how checkpoints store them
# (before 4.52 without "model.", and SigLIP's `vision_model` level before 5).
_VISION_PREFIXES = (
    (_TOWER + "vision_model.", _TOWER),
    (_TOWER, _TOWER),
    (_PROJECTOR, _PROJECTOR),
    ("vision_tower.vision_model.", _TOWER),
    ("vision_tower.", _TOWER),
    ("vision_model.", _TOWER),  # Llama 4.
    ("multi_modal_projector.", _PROJECTOR),
)


def _renamed(name: str, prefixes) -> str | None:
  for prefix, replacement in prefixes:
    if name.startswith(prefix):
      return replacement + name[len(prefix):]
  return None


def _our_names(names: Iterable[str], vision: bool) -> dict[str, str]:
  """{name our mapping uses: name in the state dict}: a multimodal
  checkpoint's text decoder under text-only names; its vision weights
  (under their current names) when the model has a `vision` tower, else
  skipped. Only names are read, so a lazy state dict stays lazy.

  Raises:
    ValueError: two names map to the same name.
  """
  names = list(names)
  renamed = {name: new for name in names
             if (new := _renamed(name, _LANGUAGE_MODEL_PREFIXES)) is not None}
  if not renamed:
    return {name: name for name in names}
  if vision:
    renamed.update({name: new for name in names if (
        new := _renamed(name, _VISION_PREFIXES)) is not None})
  ours = {}
  for name in names:
    if name not in renamed and name != "lm_head.weight":
      continue
    our_name = renamed.get(name, name)
    if our_name in ours:
      raise ValueError(f"Hugging Face weights {name!r} and another weight "
                       f"both map to {our_name!r}.")
    ours[our_name] = name
  if len(ours) < len(names):
    logging.info("Multimodal checkpoint: loading its text decoder (%d "
                 "weights), skipping %d other weights (vision tower, "
                 "projector).", len(ours), len(names) - len(ours))
  return ours


def hf_name(model: nnx.Module, name: str) -> str:
  """The name of our mapping's `name` in the Hugging Face checkpoint of
  `model`: a model with a vision tower is the multimodal one, stored as
  transformers 5 saves it (`language_model.model.*`,
  `language_model.lm_head.*`, the tower under the family's `HF_VISION_TOWER`
  (default `vision_tower.`), `multi_modal_projector.*`)."""
  if getattr(model, "vision", None) is None:
    return name
  if name.startswith(_TOWER):
    tower = getattr(registry.family_module(model.cfg.family),
                    "HF_VISION_TOWER", "vision_tower.")
    return tower + name[len(_TOWER):]
  if name.startswith(_PROJECTOR):
    return name[len("model."):]
  return "language_model." + name


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
  names = _our_names(state_dict, getattr(model, "vision", None) is not None)
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

  for entry, variable, layers in _entries(model):
    if layers is None:
      value = fetch(entry, entry.hf_name, variable.shape)
    elif isinstance(layers, int):
      value = fetch(entry, entry.hf_name.format(layer=layers), variable.shape)
    else:
      # Filled layer by layer: one stacked copy, not a list plus a stack.
      value = np.empty(variable.shape, variable.dtype)
      for i, layer in enumerate(layers):
        value[i] = fetch(entry, entry.hf_name.format(layer=layer),
                         variable.shape[1:])
    # Replaces the value, so an abstract model (`nnx.eval_shape`) fills too.
    variable.set_value(jnp.asarray(value, variable.dtype))
  used.update(name for name, _, _ in _mtp_copies(model))
  family = registry.family_module(model.cfg.family)
  known = {entry.hf_name for entry in family.HF_PARAMS}
  cfg = model.cfg
  beyond = sorted(name for name in set(names) - used
                  if (_layer_of(name) or 0) >= cfg.num_layers + cfg.mtp.layers)
  if beyond and hasattr(family, "HF_MTP_PARAMS"):
    logging.info("Skipping %d Hugging Face weights of multi-token prediction"
                 " layers (>= %d) that the model (mtp_layers=%d) lacks.",
                 len(beyond), cfg.num_layers + cfg.mtp.layers, cfg.mtp.layers)
    used.update(beyond)
  skipped = set(names) & getattr(family, "hf_skipped_weights",
                                 lambda _: frozenset())(cfg)
  skipped |= {name for name in names
              if name.startswith(getattr(family, "HF_SKIPPED_PREFIXES", ()))}
  if skipped:
    logging.info("Skipping %d Hugging Face weights the %s model does not "
                 "use: %s", len(skipped), cfg.family, sorted(skipped))
    used.update(skipped)
  # Weights of parameters this configuration lacks (a tied model's lm_head)
  # are ignored; anything else left over means a mapping is missing.
  unexpected = sorted(set(names) - used - known)
  if unexpected:
    raise ValueError(f"Hugging Face weights with no place in the "
                     f"{model.cfg.family} model: {unexpected}.")


def model_from_hf_weights(
    cfg: ModelConfig, state_dict: Mapping[str, np.ndarray],
    execution: execution_lib.Execution = execution_lib.Execution()
) -> nnx.Module:
  """`cfg`'s model holding Hugging Face weights, to run under `execution`:
  built abstract (`registry.abstract_model`: no random initialisation, no
  second copy) and filled by `load_hf_weights`.

  Raises:
    KeyError, TypeError, ValueError: as `load_hf_weights`; also ValueError
      naming the model's variables no weight set.
  """
  model = registry.abstract_model(cfg, execution)
  load_hf_weights(model, state_dict)
  unset = [jax.tree_util.keystr(path) for path, leaf in
           jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(
               nnx.state(model)))
           if isinstance(leaf, jax.ShapeDtypeStruct)]
  if unset:
    raise ValueError(f"The {cfg.family} model has parameters with no Hugging "
                     f"Face weight mapped: {unset}.")
  return model


def iter_hf_weights(model: nnx.Module) -> Iterator[tuple[str, np.ndarray]]:
  """Yields `model`'s parameters as (Hugging Face name, numpy array), one at
  a time, so a writer can store each before the next is made."""

  entries = list(_entries(model))
  # Tensors several parameters share (`ParamMap.rows`): their parts, joined
  # once all have come.
  parts_needed = collections.Counter(
      entry.hf_name.format(layer=layer)
      for entry, _, layers in entries if entry.rows
      for layer in ([layers] if isinstance(layers, int) else layers or [0]))
  parts = collections.defaultdict(list)

  def tensors(entry, name, array):
    if entry.rows:
      parts[name].append((entry.rows, entry.to_hf(array)))
      if len(parts[name]) < parts_needed[name]:
        return []
      return [(hf_name(model, name), _joined(name, parts.pop(name)))]
    if "{expert}" not in name:
      return [(hf_name(model, name), entry.to_hf(array))]
    return [(hf_name(model, name.format(expert=expert)),
             entry.to_hf(expert_array))
            for expert, expert_array in enumerate(array)]

  for entry, variable, layers in entries:
    array = np.asarray(variable[...])
    if layers is None:
      yield from tensors(entry, entry.hf_name, array)
    elif isinstance(layers, int):
      yield from tensors(entry, entry.hf_name.format(layer=layers), array)
    else:
      for layer, layer_array in zip(layers, array, strict=True):
        yield from tensors(entry, entry.hf_name.format(layer=layer),
                           layer_array)
  for name, entry, variable in _mtp_copies(model):
    yield name, entry.to_hf(np.asarray(variable[...]))


def _joined(name: str, parts) -> np.ndarray:
  """The Hugging Face tensor `name` of its `parts` ((groups, start, stop),
  rows): each group's rows in order; ValueError if they leave a gap."""
  parts = sorted(parts, key=lambda part: part[0][1])
  groups = parts[0][0][0]
  stops = [0] + [stop for (_, _, stop), _ in parts[:-1]]
  if [start for (_, start, _), _ in parts] != stops or any(
      rows[0] != groups for rows, _ in parts):
    raise ValueError(f"The parts of Hugging Face tensor {name!r} do not "
                     f"tile it: {[rows for rows, _ in parts]}.")
  return np.concatenate(
      [array.reshape(groups, -1, *array.shape[1:]) for _, array in parts],
      axis=1).reshape(-1, *parts[0][1].shape[1:])


def to_hf_weights(model: nnx.Module) -> dict[str, np.ndarray]:
  """Returns `model`'s parameters as a Hugging Face state dict (numpy)."""
  return dict(iter_hf_weights(model))
