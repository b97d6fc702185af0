"""Parameters-only checkpoints that describe their model, and reading the
parameters of a training checkpoint.

A converted checkpoint folder (written by `save_converted`, e.g. by
`//maxtext/bin:convert_ckpt`) holds:
  model_config.json  the `ModelConfig` as JSON (family, sizes, layout, dtype);
  params/            an Orbax checkpoint of the model's variables: the nested
                     dict of `nnx.to_pure_dict(nnx.state(model))`, i.e.
                     `TrainState.params` plus the non-trained variables of
                     `TrainState.model_state` (DeepSeek-V3's router bias);
  plus any extra files (tokenizer, the original Hugging Face config).

`load_converted(dir) -> (ModelConfig, params)` needs nothing else. A training
checkpoint (`<workdir>/checkpoints/<step>/state`, parameters plus optimizer
state) is read by `load_training_params(step_dir)`, which restores the
model's variables only (not the optimizer state); its model config comes
from the workdir's config of the run that saved that step (`config.json`, or
a resumed run's `config_step<N>.json`).
`load_params(path)` accepts either (or a workdir: its newest usable
checkpoint).

Every read is verified as `train` verifies a resume: a training checkpoint's
files against its manifest (`maxtext.checkpoint.integrity`) before anything
is parsed, with its model config from the run that saved that step; a
converted checkpoint's against the manifest `save_converted` writes (those
converted before it have none, and are read with a warning); and every
floating-point parameter must be finite. Given a workdir, a checkpoint
failing any of these is reported and the next older one read; with
`lazy=True` its parameters are checked for NaN only as each is read, so one
found then is raised (`ParamsCheckpointError`) with no fallback.

Parameters are restored onto one device (the first), replicated, a group of
arrays at a time (128 MiB, or one larger array); with `lazy=True` each is a
`LazyParam`, read when indexed, so an exporter holds one parameter at a time
instead of the model (a model of one group is read at once, into host
memory).
"""

from collections.abc import Callable
import functools
import json
import os
from typing import Any

from absl import logging
from flax import nnx
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from maxtext.checkpoint import integrity
from maxtext.checkpoint.manager import STATE_ITEM
from maxtext.common import json_file
from maxtext.common import model_config
from maxtext.common import workdir as workdir_lib
from maxtext.common.model_config import ModelConfig
from maxtext.models import execution as execution_lib
from maxtext.models import registry

MODEL_CONFIG_FILENAME = "model_config.json"
PARAMS_DIRNAME = "params"
WORKDIR_CONFIG_FILENAME = workdir_lib.CONFIG_FILENAME
CHECKPOINTS_DIRNAME = workdir_lib.CHECKPOINT_DIRNAME
# A converted checkpoint's own tokenizer (`tokenizer_path`).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


class ParamsCheckpointError(ValueError):
  """A checkpoint is missing or unreadable; the message names the path."""


def model_params(model: nnx.Module) -> dict[str, Any]:
  """The tree saved in a converted checkpoint: every variable of the model
  (parameters, and non-trained ones such as DeepSeek-V3's router bias)."""
  return nnx.to_pure_dict(nnx.state(model))


def model_from_params(
    cfg: ModelConfig, params: dict[str, Any],
    execution: execution_lib.Execution = execution_lib.Execution()
) -> nnx.Module:
  """`cfg`'s model holding `params`, a `model_params` tree (the arrays are
  used, not copied), to run under `execution`."""
  graphdef, state = nnx.split(registry.abstract_model(cfg, execution))
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def _abstract_params(cfg: ModelConfig, variables=...) -> dict[str, Any]:
  """Abstract `model_params` of `cfg` (only the `variables` filter's)."""
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
      nnx.to_pure_dict(nnx.state(registry.abstract_model(cfg), variables)))


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
  """Nested dicts `a` and `b` (disjoint leaves) as one."""
  merged = dict(a)
  for key, value in b.items():
    merged[key] = _merge(a[key], value) if key in a else value
  return merged


def save_converted(out_dir: str, cfg: ModelConfig,
                   params: dict[str, Any]) -> None:
  """Writes `cfg` and `params` as a converted checkpoint in `out_dir`.

  Raises:
    ParamsCheckpointError: `out_dir` already holds parameters.
  """
  params_dir = os.path.join(os.path.abspath(out_dir), PARAMS_DIRNAME)
  if os.path.exists(params_dir):
    raise ParamsCheckpointError(f"{params_dir} already exists; choose an "
                                "empty output folder.")
  os.makedirs(out_dir, exist_ok=True)
  # Orbax serialises every array at once by default, which doubles the
  # model in host memory; two of the largest arrays in flight keep the peak
  # near one model. (Its limiter needs room for the largest array.)
  in_flight_gb = 2 * max(x.nbytes for x in jax.tree.leaves(params)) / 1e9
  with ocp.Checkpointer(ocp.StandardCheckpointHandler(
      save_concurrent_gb=in_flight_gb)) as checkpointer:
    checkpointer.save(params_dir, args=ocp.args.StandardSave(params))
  # Every process took part in the save; one writes the files about it, and
  # none returns before they exist.
  if jax.process_index() == 0:
    integrity.write_manifest(params_dir)
    with open(os.path.join(out_dir, MODEL_CONFIG_FILENAME), "w",
              encoding="utf-8") as f:
      json.dump(cfg.to_dict(), f, indent=2)
      f.write("\n")
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"save_converted {params_dir}")


def _read_json(path: str) -> dict[str, Any]:
  try:
    return json_file.read_object(path)
  except json_file.JsonFileError as e:
    raise ParamsCheckpointError(str(e)) from e


def _model_config(values: dict[str, Any], path: str) -> ModelConfig:
  try:
    # Files written before execution settings left the model: migrated.
    return ModelConfig.from_dict(model_config.migrate(values))
  except (TypeError, ValueError) as e:
    raise ParamsCheckpointError(f"{path}: invalid model config: {e}") from e


def _nested(leaves: list[tuple[tuple[Any, ...], Any]]) -> dict[Any, Any]:
  """The nested dict holding each (keys, leaf) of `leaves` at its keys."""
  tree = {}
  for keys, leaf in leaves:
    node = tree
    for key in keys[:-1]:
      node = node.setdefault(key, {})
    node[keys[-1]] = leaf
  return tree


class LazyParam:
  """A parameter read from its checkpoint each time it is indexed
  (`param[...]`), and not kept: a writer that visits parameters one by one
  holds one at a time.

  Attributes:
    shape: The parameter's shape.
    dtype: Its dtype.
  """

  def __init__(self, read: Callable[[], jax.Array],
               abstract: jax.ShapeDtypeStruct):
    self._read = read
    self.shape = abstract.shape
    self.dtype = abstract.dtype

  def __getitem__(self, index) -> np.ndarray:
    return np.asarray(self._read())[index]


# Arrays restored by one Orbax call: up to this many bytes together (a larger
# array alone). Restoring costs 2-3x what a call reads while it runs; one
# call per array would cost an Orbax metadata read each (tens of ms).
_RESTORE_GROUP_BYTES = 128 << 20


def _nbytes(abstract: jax.ShapeDtypeStruct) -> int:
  return abstract.size * abstract.dtype.itemsize


def _groups(leaves: list[tuple[tuple[Any, ...], jax.ShapeDtypeStruct]]):
  """`leaves` (keys, abstract array) in consecutive groups of at most
  `_RESTORE_GROUP_BYTES` (a larger array alone)."""
  group, size = [], 0
  for keys, abstract in leaves:
    nbytes = _nbytes(abstract)
    if group and size + nbytes > _RESTORE_GROUP_BYTES:
      yield group
      group, size = [], 0
    group.append((keys, abstract))
    size += nbytes
  if group:
    yield group


def _restore(path: str, cfg: ModelConfig, *, params_key: str | None,
             lazy: bool = False, variables=...):
  """Restores the variables of `cfg` (those of the `variables` filter) from
  the Orbax checkpoint at `path` (under `params_key` of its tree when given,
  the rest left unread).

  Arrays are restored a group at a time (`_RESTORE_GROUP_BYTES`); with
  `lazy`, each leaf is a `LazyParam` instead, restored when read, unless all
  fit in one group (then read at once, as numpy arrays).
  """
  prefix = (params_key,) if params_key else ()
  abstract_params = _abstract_params(cfg, variables)
  paths, treedef = jax.tree_util.tree_flatten_with_path(abstract_params)
  leaves = [(prefix + tuple(k.key for k in key_path), abstract)
            for key_path, abstract in paths]

  xp = np if lazy else jnp  # Host arrays stay on the host.

  def read(checkpointer, group):
    target = _nested(group)
    # A lazy read goes to host memory only (no device copy).
    restore_args = (
        _nested([(keys, ocp.RestoreArgs(restore_type=np.ndarray))
                 for keys, _ in group])
        if lazy else ocp.checkpoint_utils.construct_restore_args(target))
    try:
      restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
          item=target, restore_args=restore_args, partial_restore=True))
    except Exception as e:  # Orbax and TensorStore raise many kinds.
      raise ParamsCheckpointError(
          f"Parameters in {path} could not be restored for the {cfg.family} "
          f"model (missing, corrupt, or another model): {type(e).__name__}: "
          f"{e}") from e
    arrays = []
    for keys, abstract in group:
      array = functools.reduce(lambda tree, key: tree[key], keys, restored)
      if (jnp.issubdtype(abstract.dtype, jnp.inexact) and
          not bool(xp.all(xp.isfinite(array)))):
        raise ParamsCheckpointError(
            f"Parameter {'/'.join(map(str, keys))} in {path} holds NaN or"
            " infinite values.")
      arrays.append(array)
    return arrays

  def read_one(keys, abstract):
    with ocp.PyTreeCheckpointer() as checkpointer:
      [array] = read(checkpointer, [(keys, abstract)])
    return array

  if lazy and sum(_nbytes(a) for _, a in leaves) > _RESTORE_GROUP_BYTES:
    return treedef.unflatten([
        LazyParam(functools.partial(read_one, keys, abstract), abstract)
        for keys, abstract in leaves])
  arrays = []
  with ocp.PyTreeCheckpointer() as checkpointer:
    for group in _groups(leaves):
      arrays.extend(read(checkpointer, group))
  return treedef.unflatten(arrays)


def load_converted(checkpoint_dir: str, *, lazy: bool = False
                   ) -> tuple[ModelConfig, dict[str, Any]]:
  """(ModelConfig, params) of a converted checkpoint (see module docstring).

  Raises:
    ParamsCheckpointError: a file is missing or unreadable (names it).
  """
  checkpoint_dir = os.path.abspath(checkpoint_dir)
  config_path = os.path.join(checkpoint_dir, MODEL_CONFIG_FILENAME)
  cfg = _model_config(_read_json(config_path), config_path)
  params_dir = os.path.join(checkpoint_dir, PARAMS_DIRNAME)
  if os.path.lexists(os.path.join(params_dir, integrity.MANIFEST_FILENAME)):
    _verify(params_dir)
  else:  # Converted before manifests were written.
    logging.warning("%s has no %s: its files cannot be verified.",
                    params_dir, integrity.MANIFEST_FILENAME)
  return cfg, _restore(params_dir, cfg, params_key=None, lazy=lazy)


def _verify(folder: str) -> None:
  """Raises `ParamsCheckpointError` unless `folder` matches its manifest."""
  problems = integrity.check(folder)
  if problems:
    raise ParamsCheckpointError(
        f"Checkpoint {folder} is corrupt: {integrity.summary(problems)}.")


def training_workdir(step_dir: str) -> str:
  """The workdir of training checkpoint `<workdir>/checkpoints/<step>`."""
  return os.path.dirname(os.path.dirname(os.path.abspath(step_dir)))


def _step_config_path(step_dir: str) -> str:
  """The workdir config of the run that saved training checkpoint
  `step_dir` (`workdir.step_config_path`)."""
  workdir, name = training_workdir(step_dir), os.path.basename(step_dir)
  if name.isdigit() and os.path.isdir(workdir):
    return workdir_lib.step_config_path(workdir, int(name))
  return os.path.join(workdir, WORKDIR_CONFIG_FILENAME)


def load_training_params(step_dir: str, *, lazy: bool = False
                         ) -> tuple[ModelConfig, dict[str, Any]]:
  """(ModelConfig, `model_params` tree) of a train-binary checkpoint: its
  `params` and `model_state`; the optimizer state and the rest are not read.

  The checkpoint's files are first verified against its manifest (as
  `train` does before restoring), and its model config is that of the run
  that saved the step (`workdir.step_config_path`).

  Raises:
    ParamsCheckpointError: the checkpoint or its config is missing,
      unreadable, corrupt, or holds NaN or infinity (names it).
  """
  step_dir = os.path.abspath(step_dir)
  _verify(step_dir)
  config_path = _step_config_path(step_dir)
  config = _read_json(config_path)
  if "model" not in config:
    raise ParamsCheckpointError(f"{config_path} has no 'model' section.")
  cfg = _model_config(config["model"], config_path)
  state_dir = os.path.join(os.path.abspath(step_dir), STATE_ITEM)
  params = _restore(state_dir, cfg, params_key="params", lazy=lazy,
                    variables=nnx.Param)
  model_state = _restore(state_dir, cfg, params_key="model_state", lazy=lazy,
                         variables=nnx.Not(nnx.Param))
  return cfg, _merge(params, model_state)


def _load_newest(checkpoints_dir: str, *, lazy: bool
                 ) -> tuple[ModelConfig, dict[str, Any]]:
  """`load_training_params` of the newest usable checkpoint in
  `checkpoints_dir`: a corrupt or unreadable one is reported and the next
  older one read, as `train` resumes (nothing is renamed: a reader leaves
  the workdir as it is). With `lazy`, values are checked only when read."""
  steps = sorted((int(name) for name in os.listdir(checkpoints_dir)
                  if name.isdigit()), reverse=True)
  if not steps:
    raise ParamsCheckpointError(f"No finished checkpoint in {checkpoints_dir}.")
  failures = []
  for step in steps:
    try:
      return load_training_params(os.path.join(checkpoints_dir, str(step)),
                                  lazy=lazy)
    except ParamsCheckpointError as e:
      logging.warning("%s Trying an older checkpoint.", e)
      failures.append(str(e))
  raise ParamsCheckpointError(
      f"No usable checkpoint in {checkpoints_dir}: {' '.join(failures)}")


def tokenizer_path(checkpoint: str) -> str | None:
  """The tokenizer file that belongs to `checkpoint`, or None.

  A converted checkpoint's own tokenizer.json / tokenizer.model; for a
  training checkpoint, the `data.tokenizer` of the config it was saved with
  (a workdir: that of its newest checkpoint), None when that is empty.
  """
  checkpoint = os.path.abspath(checkpoint)
  for name in TOKENIZER_FILES:
    if os.path.isfile(os.path.join(checkpoint, name)):
      return os.path.join(checkpoint, name)
  checkpoints = os.path.join(checkpoint, CHECKPOINTS_DIRNAME)
  if os.path.isdir(checkpoints):
    steps = [int(name) for name in os.listdir(checkpoints) if name.isdigit()]
    config_path = workdir_lib.step_config_path(checkpoint,
                                               max(steps, default=0))
  else:
    config_path = _step_config_path(checkpoint)
  if not os.path.isfile(config_path):
    return None
  data = _read_json(config_path).get("data")
  return (data.get("tokenizer") or None) if isinstance(data, dict) else None


def load_model_config(path: str) -> ModelConfig:
  """The `ModelConfig` of any checkpoint `load_params` reads, without its
  parameters: a converted checkpoint's `model_config.json` alone (what
  compiling ahead of time for a checkpoint needs; `aot_compile`).

  Raises:
    ParamsCheckpointError: `path` is no checkpoint, or cannot be read.
  """
  config_path = os.path.join(os.path.abspath(path), MODEL_CONFIG_FILENAME)
  if os.path.exists(config_path):
    return _model_config(_read_json(config_path), config_path)
  return load_params(path, lazy=True)[0]


def load_params(path: str, *, lazy: bool = False
                ) -> tuple[ModelConfig, dict[str, Any]]:
  """(ModelConfig, params) of a converted checkpoint, a training checkpoint
  `<workdir>/checkpoints/<step>`, or a workdir (its latest checkpoint).

  Raises:
    ParamsCheckpointError: `path` is none of these, or cannot be read.
  """
  path = os.path.abspath(path)
  if os.path.exists(os.path.join(path, MODEL_CONFIG_FILENAME)):
    return load_converted(path, lazy=lazy)
  if os.path.isdir(os.path.join(path, STATE_ITEM)):
    return load_training_params(path, lazy=lazy)
  if os.path.isdir(os.path.join(path, CHECKPOINTS_DIRNAME)):
    return _load_newest(os.path.join(path, CHECKPOINTS_DIRNAME), lazy=lazy)
  raise ParamsCheckpointError(
      f"{path} is not a checkpoint: expected a converted checkpoint (with "
      f"{MODEL_CONFIG_FILENAME}), a training checkpoint "
      f"<workdir>/{CHECKPOINTS_DIRNAME}/<step> (with {STATE_ITEM}/) or a "
      "training workdir.")
