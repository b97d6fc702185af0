"""Training checkpoints: an Orbax `CheckpointManager` with clear errors.

A checkpoint at step `s` (after `s` updates) lives in `<directory>/<s>/` with
two items:
  state: the training state pytree (parameters, optimizer state, step),
    restored into an already-built abstract tree (shapes, dtypes, shardings);
  data: the input pipeline position, a small JSON dict.

Saving is asynchronous when configured: `save` returns once the arrays are
copied off the device and the files are written in the background; `wait`
blocks until they are durable. Only finished checkpoints are visible to
`latest_step` (Orbax writes to a temporary folder and renames it at the end).
"""

import dataclasses
import os
from typing import Any

import orbax.checkpoint as ocp

STATE_ITEM = "state"
DATA_ITEM = "data"


class CheckpointError(RuntimeError):
  """A checkpoint is missing or cannot be read; the message names its path."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
  """The `checkpoint` config section.

  Attributes:
    every_steps: Save every this many updates (and always at the end of a
      run); 0 saves only at the end.
    max_to_keep: Most recent checkpoints kept on disk.
    async_save: Write files in the background while training continues.
  """

  every_steps: int
  max_to_keep: int
  async_save: bool

  def __post_init__(self):
    if self.every_steps < 0:
      raise ValueError(
          f"checkpoint.every_steps={self.every_steps!r} must be >= 0.")
    if self.max_to_keep < 1:
      raise ValueError(
          f"checkpoint.max_to_keep={self.max_to_keep!r} must be >= 1.")


class Checkpointer:
  """Saves and restores training checkpoints under one directory."""

  def __init__(self, directory: str, config: CheckpointConfig):
    self.directory = os.path.abspath(directory)
    self.config = config
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=config.max_to_keep,
            enable_async_checkpointing=config.async_save,
            create=True),
        item_names=(STATE_ITEM, DATA_ITEM))

  def step_path(self, step: int) -> str:
    """Directory of the checkpoint of `step`."""
    return os.path.join(self.directory, str(step))

  def all_steps(self) -> list[int]:
    """Steps of the finished checkpoints, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """Step of the newest finished checkpoint, or None when there is none."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, data_state: dict[str, Any]) -> None:
    """Saves `state` and `data_state` as the checkpoint of `step`.

    Does nothing when `step` is already saved (e.g. a periodic save that is
    also the last step).
    """
    if step in self._manager.all_steps():
      return
    self._manager.save(
        step,
        args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(state),
            DATA_ITEM: ocp.args.JsonSave(data_state),
        }),
        force=True)

  def restore(self, abstract_state: Any,
              step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores a checkpoint into the structure of `abstract_state`.

    Args:
      abstract_state: Pytree of `jax.ShapeDtypeStruct` (with shardings) or
        arrays, the same structure the checkpoint was saved from.
      step: The step to restore; None means the latest.

    Returns:
      (state, data_state).

    Raises:
      CheckpointError: there is no such checkpoint, or it cannot be read
        (corrupt, or saved from a different model); the error names the path.
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
    try:
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(**{
              STATE_ITEM: ocp.args.StandardRestore(abstract_state),
              DATA_ITEM: ocp.args.JsonRestore(),
          }))
    except Exception as e:  # Orbax and TensorStore raise many kinds.
      raise CheckpointError(
          f"Checkpoint {path} could not be restored (corrupt, or saved from a"
          f" different model or optimizer): {type(e).__name__}: {e}") from e
    return restored[STATE_ITEM], dict(restored[DATA_ITEM])

  def wait(self) -> None:
    """Blocks until every started save is durable."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()
