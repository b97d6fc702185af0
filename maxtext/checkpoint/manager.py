"""Training checkpoints: Orbax managers in tiers, verified, with clear errors.

A checkpoint at step `s` (after `s` updates) lives in `<directory>/<s>/` with
two items:
  state: the training state pytree (parameters, optimizer state, step),
    restored into an already-built abstract tree (shapes, dtypes, shardings);
  data: the input pipeline position, a small JSON dict;
and `maxtext_manifest.json`, the size and SHA-256 of every file
(`maxtext.checkpoint.integrity`).

Atomicity: Orbax writes a checkpoint into `<s>.orbax-checkpoint-tmp`, and the
manifest is written into that folder (by process 0, after every process has
written its files) before Orbax renames it to `<s>`: a step folder is visible
only once complete, manifest included. A temporary folder left by a killed
run is deleted when the next run opens the directory.

Saving is asynchronous when configured: `save` returns once the arrays are
copied off the device, and the files, the manifest and the rename happen in
the background; `wait` blocks until they are durable. A failed background
write (e.g. a full disk) is raised by the next `save` or `wait` as a
`CheckpointError` naming the step and path; the checkpoints before it are
untouched (Orbax deletes old checkpoints only after a new one is committed).

Tiers: a run may keep a fast local tier (`CheckpointConfig.local_dir` of
`maxtext.checkpoint.checkpoint_config`) next to the persistent one
(`<workdir>/checkpoints`), each a `Checkpointer`; `tiers.restore_newest`
takes the newest usable step of any tier: it verifies each candidate against its
manifest, newest first, and skips (reporting step and path) the corrupt
ones, renaming them to `<s>.corrupt-<time>` once an older one has restored
so that the run can save that step again. Since the manifest is part of the
commit, a step folder without a valid one is corrupt too. A checkpoint whose
arrays do not fit the model (another model's shapes) is an error, not a
fallback: older checkpoints of the run would not fit either.

Checkpoints are read only through Orbax (TensorStore arrays) and JSON: nothing
is ever unpickled.
"""

from collections.abc import Callable
import os
import shutil
import time
from typing import Any

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from maxtext.checkpoint import integrity

STATE_ITEM = "state"
DATA_ITEM = "data"
# Orbax's name for a step folder being written (orbax.checkpoint atomicity).
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"
CORRUPT_MARK = ".corrupt-"


# (the saved state's metadata tree, the abstract state wanted) -> (the
# abstract tree to restore into, the function that makes the wanted state of
# the restored one). Lets a run resume from a checkpoint whose layout a
# config change altered (e.g. the update guard switched on), each checkpoint
# converted from its own layout; `_check_fits` then checks the target.
Migration = Callable[[Any, Any], tuple[Any, Callable[[Any], Any]]]


class CheckpointError(RuntimeError):
  """A checkpoint is missing or cannot be read; the message names its path."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint holds arrays of another model (names the path and array)."""


def _all_processes(ok: bool) -> bool:
  """Whether `ok` holds on every process (one tiny all-gather if several)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def _path_str(path) -> str:
  parts = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)


def _shapes(tree) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {_path_str(path): tuple(leaf.shape) for path, leaf in leaves}


# Orbax's errors may print a whole state tree; messages keep their start
# and end (where TensorStore puts the cause).
_ERROR_HEAD_CHARS = 700
_ERROR_TAIL_CHARS = 300


def describe(error: Exception) -> str:
  """`Type: message` of an Orbax error, its middle cut when too long."""
  text = str(error)
  if len(text) > _ERROR_HEAD_CHARS + _ERROR_TAIL_CHARS:
    text = (f"{text[:_ERROR_HEAD_CHARS]} [...]"
            f" {text[-_ERROR_TAIL_CHARS:]}")
  return f"{type(error).__name__}: {text}"


def orbax_manager(directory: str, *, max_to_keep: int,
                  on_commit: Callable[[], None],
                  multiprocessing: ocp.options.MultiprocessingOptions,
                  state_handler: ocp.CheckpointHandler,
                  create: bool = True,
                  directories_in_background: bool = True
                  ) -> ocp.CheckpointManager:
  """An Orbax manager of the `state` and `data` items in `directory`.

  `on_commit` runs after the files are written, before the step folder is
  renamed into place. Orbax's async checkpointer even when saves block
  (`wait` after each): only it runs that callback. Without
  `directories_in_background` the step's folders exist before `save`
  returns (a process saving alone: its JSON item would race them).
  """
  return ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep,
          enable_async_checkpointing=True,
          async_options=ocp.AsyncOptions(
              post_finalization_callback=on_commit,
              create_directories_asynchronously=directories_in_background),
          multiprocessing_options=multiprocessing,
          create=create),
      item_names=(STATE_ITEM, DATA_ITEM),
      item_handlers={
          STATE_ITEM: state_handler,
          DATA_ITEM: ocp.JsonCheckpointHandler(
              multiprocessing_options=multiprocessing)})


class Checkpointer:
  """Saves and restores training checkpoints under one directory (a tier)."""

  def __init__(self, directory: str, *, max_to_keep: int, async_save: bool,
               tier: str = "persistent"):
    """Opens (creating) `directory`; deletes temporary folders of killed runs.

    Args:
      directory: Where the step folders go.
      max_to_keep: Most recent checkpoints kept.
      async_save: Whether `save` returns before the files are written.
      tier: Name of the tier, for messages.
    """
    self.directory = os.path.abspath(directory)
    self.tier = tier
    self.async_save = async_save
    self._saving_step = None  # Step of the save in flight, if any.
    if self._cleans_up():
      self._delete_unfinished()
    self._manager = self._orbax_manager(max_to_keep)

  def _cleans_up(self) -> bool:
    """Whether this process deletes unfinished saves (process 0: the
    directory is shared)."""
    return jax.process_index() == 0

  def _orbax_manager(self, max_to_keep: int) -> ocp.CheckpointManager:
    """The Orbax manager of the tier's directory, shared by all processes."""
    # The tiers save the same step at once (the last one, a preemption's):
    # Orbax names its processes' barriers by this prefix, which must differ
    # between managers that run concurrently (the same barrier twice:
    # "already ongoing").
    return orbax_manager(
        self.directory, max_to_keep=max_to_keep,
        on_commit=self._write_manifest,
        multiprocessing=ocp.options.MultiprocessingOptions(
            barrier_sync_key_prefix=self.tier),
        state_handler=ocp.StandardCheckpointHandler())

  def _state_save_args(self, state: Any) -> ocp.args.CheckpointArgs:
    """The save args of the state item, for `_orbax_manager`'s handler."""
    return ocp.args.StandardSave(state)

  def _delete_unfinished(self) -> None:
    """Deletes the temporary folders of saves a killed run left behind."""
    if not os.path.isdir(self.directory):
      return
    for name in sorted(os.listdir(self.directory)):
      if ORBAX_TMP_SUFFIX in name:
        path = os.path.join(self.directory, name)
        logging.warning("Deleting %s, an unfinished save.", path)
        shutil.rmtree(path)

  def step_path(self, step: int) -> str:
    """Directory of the checkpoint of `step`."""
    return os.path.join(self.directory, str(step))

  def all_steps(self) -> list[int]:
    """Steps of the finished checkpoints, ascending."""
    return sorted(self._manager.all_steps())

  def reload(self) -> None:
    """Re-reads the steps from disk (after a change by someone else)."""
    self._manager.reload()

  def latest_step(self) -> int | None:
    """Step of the newest finished checkpoint, or None when there is none."""
    return self._manager.latest_step()

  def _write_manifest(self) -> None:
    # Orbax calls this on process 0 in the save thread, after all processes
    # wrote their files and before it renames the temporary folder.
    tmp_dir = self.step_path(self._saving_step) + ORBAX_TMP_SUFFIX
    if not os.path.isdir(tmp_dir):
      raise CheckpointError(
          f"Expected Orbax's temporary folder {tmp_dir} to write the manifest"
          " into; has Orbax's layout changed?")
    integrity.write_manifest(tmp_dir)

  def _save_failed(self, step: int, error: Exception) -> CheckpointError:
    self.reload()
    return CheckpointError(
        f"Writing the {self.tier} checkpoint {self.step_path(step)} failed:"
        f" {describe(error)}. Earlier checkpoints in"
        f" {self.directory} are intact: steps"
        f" {sorted(self._manager.all_steps()) or 'none'}.")

  def save(self, step: int, state: Any, data_state: dict[str, Any]) -> None:
    """Saves `state` and `data_state` as the checkpoint of `step`.

    Does nothing when `step` is already saved (e.g. a periodic save that is
    also the last step).

    Raises:
      CheckpointError: this save, or the background part of the previous
        one, failed (names its step and path).
    """
    self.wait()  # Reports a failed previous save as such.
    if step in self._manager.all_steps():
      return
    self._saving_step = step
    try:
      self._manager.save(
          step,
          args=ocp.args.Composite(**{
              STATE_ITEM: self._state_save_args(state),
              DATA_ITEM: ocp.args.JsonSave(data_state),
          }),
          force=True)
    except Exception as e:  # Orbax and TensorStore raise many kinds.
      self._saving_step = None
      raise self._save_failed(step, e) from e
    if not self.async_save:
      self.wait()

  def wait(self) -> None:
    """Blocks until every started save is durable.

    Raises:
      CheckpointError: the save in flight failed (names its step and path).
    """
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # Raised from Orbax's save thread.
      if self._saving_step is None:
        raise
      raise self._save_failed(self._saving_step, e) from e
    finally:
      self._saving_step = None

  def check(self, step: int) -> list[str]:
    """Problems of the files of `step` against its manifest; [] if intact.

    Every process checks a share of the files; whether the list is empty is
    the same on all of them.
    """
    problems = integrity.check(self.step_path(step),
                               shard_index=jax.process_index(),
                               shard_count=jax.process_count())
    if not _all_processes(not problems):
      return problems or ["files checked by another process differ from the"
                          " manifest (see its log)"]
    return []

  def _saved_state(self, step: int) -> Any:
    """The metadata tree (shapes, dtypes) of `step`'s state item."""
    path = self.step_path(step)
    try:
      saved = self._manager.item_metadata(step)[STATE_ITEM]
    except Exception as e:  # Unreadable metadata: a corrupt checkpoint.
      raise CheckpointError(
          f"Checkpoint {path} is corrupt: its metadata cannot be read:"
          f" {describe(e)}") from e
    if saved is None:
      raise CheckpointError(f"Checkpoint {path} has no '{STATE_ITEM}' item.")
    return saved

  def _check_fits(self, step: int, saved: Any, abstract_state: Any) -> None:
    """Raises `CheckpointMismatchError` if `step` (`saved`: its state's
    metadata) holds another model than `abstract_state`."""
    path = self.step_path(step)
    saved_shapes = _shapes(saved)
    want_shapes = _shapes(abstract_state)
    differences = {
        name: f"{saved_shapes[name]} in the checkpoint, {shape} in the model"
        for name, shape in want_shapes.items()
        if name in saved_shapes and saved_shapes[name] != shape}
    differences.update({name: "not in the checkpoint"
                        for name in set(want_shapes) - set(saved_shapes)})
    differences.update({name: "not in the model"
                        for name in set(saved_shapes) - set(want_shapes)})
    if differences:
      # Shortest paths first: parameters before their optimizer moments.
      shown = "; ".join(f"{name}: {differences[name]}" for name in sorted(
          differences, key=lambda n: (n.count("/"), n))[:3])
      more = (f" (and {len(differences) - 3} more)"
              if len(differences) > 3 else "")
      raise CheckpointMismatchError(
          f"Checkpoint {path} was saved from a different model or optimizer:"
          f" {shown}{more}. Resume with the config it was saved with, or use"
          " a new workdir.")

  def restore(self, abstract_state: Any, step: int | None = None, *,
              migrate: Migration | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores a checkpoint into the structure of `abstract_state`.

    The files are not verified against the manifest here (see `check` and
    `tiers.restore_newest`).

    Args:
      abstract_state: Pytree of `jax.ShapeDtypeStruct` (with shardings) or
        arrays, the same structure the checkpoint was saved from.
      step: The step to restore; None means the latest.
      migrate: Converts a checkpoint saved in another layout (see
        `Migration`).

    Returns:
      (state, data_state).

    Raises:
      CheckpointMismatchError: the checkpoint holds another model's arrays.
      CheckpointError: there is no such checkpoint, or it cannot be read;
        the error names the path.
    """
    if step is None:
      step = self.latest_step()
      if step is None:
        raise CheckpointError(f"No checkpoint found in {self.directory}.")
    path = self.step_path(step)
    if step not in self._manager.all_steps():
      raise CheckpointError(
          f"Checkpoint {path} does not exist; checkpoints in"
          f" {self.directory}: {self.all_steps() or 'none'}.")
    saved = self._saved_state(step)
    target, convert = (migrate(saved, abstract_state) if migrate else
                       (abstract_state, None))
    self._check_fits(step, saved, target)
    try:
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(**{
              STATE_ITEM: ocp.args.StandardRestore(target),
              DATA_ITEM: ocp.args.JsonRestore(),
          }))
    except Exception as e:  # Orbax and TensorStore raise many kinds.
      raise CheckpointError(
          f"Checkpoint {path} could not be restored (corrupt, or saved from a"
          f" different model or optimizer): {describe(e)}") from e
    data_state = restored[DATA_ITEM]
    if not isinstance(data_state, dict):
      raise CheckpointError(
          f"Checkpoint {path}: the '{DATA_ITEM}' item is not a JSON object.")
    state = restored[STATE_ITEM]
    return (convert(state) if convert else state), dict(data_state)

  def quarantine(self, step: int) -> str:
    """Renames the folder of `step` out of the way; returns its new path.

    Process 0 renames; every process then sees the step gone.
    """
    path = self.step_path(step)
    new_path = f"{path}{CORRUPT_MARK}{int(time.time())}"
    if jax.process_index() == 0:
      os.rename(path, new_path)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"quarantine {path}")
    self.reload()
    return new_path

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    try:
      self.wait()
    finally:
      self._manager.close()
