"""Saving a compiled train step, and loading it only for the run it fits.

`save_compiled(path, step, experiment)` writes one zip file
(`save_executable`) holding
  executable.bin    the executable (`jax.experimental.serialize_executable`);
  fingerprint.json  what it was compiled for: the config sections that shape
                    the step (model, optimizer, train without the seed, mesh,
                    sharding, the batch's length and keys), the topology
                    (platform, device kind, device and slice counts, mesh
                    shape) and the jax/jaxlib versions.
`load_compiled(path, experiment, mesh, state, batch)` recomputes the
fingerprint for the run at hand and refuses a file made for anything else
with `MismatchError`, listing every differing key with both values
(`load_executable`). The post-training steps are saved and loaded with the
same two functions (`maxtext.posttrain.compiled_step`). A file is
loaded with pickle: load only files you made (jax's own warning).
"""

from collections.abc import Mapping
import dataclasses
import json
from typing import Any
import zipfile

import jax
from jax.experimental import serialize_executable
import jaxlib

from maxtext.trainers import train_step as train_step_lib
from maxtext.trainers.config import ExperimentConfig

_EXECUTABLE = "executable.bin"
_FINGERPRINT = "fingerprint.json"


class MismatchError(ValueError):
  """A saved step was compiled for another config, topology or jax."""


def _plain(value: Any) -> Any:
  """`value` as JSON would give it back (tuples as lists)."""
  return json.loads(json.dumps(value))


def fingerprint(config: Mapping[str, Any],
                mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """What a compiled step depends on, as plain JSON data: `config` (the
  config sections that shape the step), the topology of `mesh` and the
  versions of jax and jaxlib."""
  devices = mesh.devices.flat
  first = next(iter(devices))
  return _plain({
      "config": config,
      "topology": {
          "platform": first.platform,
          "device_kind": first.device_kind,
          "num_devices": mesh.size,
          "num_slices": len({getattr(d, "slice_index", 0)
                             for d in mesh.devices.flat}),
          "mesh_shape": dict(mesh.shape),
      },
      "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__},
  })


def train_config(experiment: ExperimentConfig,
                 keys: tuple[str, ...]) -> dict[str, Any]:
  """The sections of `experiment` that shape the train step (model,
  optimizer, train without the seed, mesh, sharding, the batch's length
  and keys)."""
  train = dataclasses.asdict(experiment.train)
  del train["seed"]  # Initialisation only; not part of the step.
  return {
      "model": experiment.model.to_dict(),
      "optimizer": dataclasses.asdict(experiment.optimizer),
      "train": train,
      "mesh": dataclasses.asdict(experiment.mesh),
      "sharding": dataclasses.asdict(experiment.sharding),
      "batch": {"seq_len": experiment.data.seq_len, "keys": sorted(keys)},
  }


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def differences(saved: Mapping[str, Any],
                current: Mapping[str, Any]) -> list[str]:
  """`key: compiled for X, this run Y` for each key whose values differ
  (a key only one side has shows "(absent)" on the other)."""
  saved, current = _flatten(saved), _flatten(current)
  lines = []
  for key in sorted(set(saved) | set(current)):
    old = repr(saved[key]) if key in saved else "(absent)"
    new = repr(current[key]) if key in current else "(absent)"
    if old != new:
      lines.append(f"{key}: compiled for {old}, this run {new}")
  return lines


def disable_compilation_cache() -> None:
  """Turns JAX's persistent compilation cache off in this process; call it
  before the process compiles anything (JAX decides at its first
  compilation whether to use the cache), when it will save a compiled
  step. An executable that the cache loaded
  does not serialise whole again (jax 0.10.2 drops its custom calls: the
  load fails with "Function ... not found", or a CPU step's collectives
  wait forever)."""
  jax.config.update("jax_enable_compilation_cache", False)


def save_executable(path: str, compiled: jax.stages.Compiled,
                    saved_for: Mapping[str, Any]) -> None:
  """Writes `compiled` and `saved_for` (its `fingerprint`) to `path`.

  Raises:
    ValueError: the executable cannot be serialised.
  """
  payload, _, _ = serialize_executable.serialize(compiled)
  with zipfile.ZipFile(path, "w") as archive:
    archive.writestr(_FINGERPRINT, json.dumps(saved_for, indent=1,
                                              sort_keys=True))
    archive.writestr(_EXECUTABLE, payload)


def load_executable(path: str, current: Mapping[str, Any], in_tree: Any,
                    out_tree: Any) -> jax.stages.Compiled:
  """The executable saved in `path` by `save_executable`, for the run whose
  `fingerprint` is `current`, called with arguments of `in_tree` (`((args,
  kwargs))`) and returning `out_tree`.

  Raises:
    MismatchError: `path` was compiled for another config, topology or
      versions (the message lists each difference).
    OSError: `path` cannot be read or is not a saved step.
  """
  try:
    with zipfile.ZipFile(path) as archive:
      saved = json.loads(archive.read(_FINGERPRINT))
      payload = archive.read(_EXECUTABLE)
  except (zipfile.BadZipFile, KeyError) as e:
    raise OSError(f"{path} is not a train step saved by aot_compile --save"
                  f" ({e}).") from e
  diffs = differences(saved, current)
  if diffs:
    raise MismatchError(
        f"{path} was compiled for another config or topology; "
        + "; ".join(diffs) + ". Compile it again for this run (aot_compile"
        " --save) or train without it.")
  return serialize_executable.deserialize_and_load(
      payload, in_tree, out_tree, backend=current["topology"]["platform"])


def save_compiled(path: str, step: Any, experiment: ExperimentConfig) -> None:
  """Writes the executable of `step` (a `compile_step.CompiledStep`; not
  imported, so that `train --compiled` needs no libtpu) and its fingerprint
  to `path`.

  Raises:
    ValueError: the executable cannot be serialised.
  """
  keys = tuple(step.inputs.batch_specs)
  save_executable(path, step.compiled, fingerprint(
      train_config(experiment, keys), step.mesh))


def load_compiled(path: str, experiment: ExperimentConfig,
                  mesh: jax.sharding.Mesh, state: Any,
                  batch: Mapping[str, Any]) -> jax.stages.Compiled:
  """The train step saved in `path`, to run `experiment` on `mesh`.

  Args:
    path: A file written by `save_compiled` (`aot_compile --save`).
    experiment: The run's config.
    mesh: The run's mesh.
    state: The run's train state (arrays or `jax.ShapeDtypeStruct`s); the
      step is called with states of this structure.
    batch: The run's batch (arrays or specs), by key.

  Returns:
    The executable, called as `step(state, batch)` like `train_step`.

  Raises:
    MismatchError: `path` was compiled for another config, topology or jax
      (the message lists each difference).
    OSError: `path` cannot be read or is not a saved step.
  """
  in_tree = jax.tree.structure(((state, dict(batch)), {}))
  out_tree = jax.tree.structure(
      jax.eval_shape(train_step_lib.train_step, state, dict(batch)))
  return load_executable(
      path, fingerprint(train_config(experiment, tuple(batch)), mesh),
      in_tree, out_tree)
