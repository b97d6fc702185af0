"""Resuming from the newest usable checkpoint of any tier.

`restore_newest(checkpointers, abstract_state)` tries the steps of every
tier (`maxtext.checkpoint.manager.Checkpointer`, or the peer tier's
`maxtext.checkpoint.peer.PeerCheckpointer`) newest first, verifies each, and
sets the unusable newer ones aside once one restores.
"""

from collections.abc import Callable
import dataclasses
from typing import Any

from absl import logging

from maxtext.checkpoint import integrity
from maxtext.checkpoint.manager import Checkpointer
from maxtext.checkpoint.manager import CheckpointError
from maxtext.checkpoint.manager import CheckpointMismatchError
from maxtext.checkpoint.manager import Migration


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `restore_newest` found.

  Attributes:
    step: The checkpoint's step.
    state: The restored pytree.
    data_state: The input pipeline position saved with it.
    path: Its folder.
    tier: The tier it came from.
  """

  step: int
  state: Any
  data_state: dict[str, Any]
  path: str
  tier: str


def restore_newest(checkpointers: list[Checkpointer], abstract_state: Any, *,
                   check: Callable[[Any], str | None] | None = None,
                   migrate: Migration | None = None) -> Restored | None:
  """Restores the newest usable checkpoint of any tier.

  Candidates are tried newest first (on a tie, the earlier checkpointer in
  the list first). A candidate failing its manifest check, its restore or
  `check` is reported and the next one tried; once one restores, the failed
  newer ones are renamed aside (`Checkpointer.quarantine`) so that their
  steps can be saved again.

  Args:
    checkpointers: The tiers, fastest first (called on every process alike:
      the peer tier's methods exchange what each process holds).
    abstract_state: The structure to restore into (see
      `Checkpointer.restore`).
    check: What is wrong with a restored state (e.g. "holds NaN"), or None
      when it is usable.
    migrate: Converts checkpoints saved in another layout (`Migration`);
      each candidate is converted from its own.

  Returns:
    The restored checkpoint, or None when no tier has any.

  Raises:
    CheckpointMismatchError: a checkpoint holds another model's arrays.
    CheckpointError: there are checkpoints but none is usable (names each
      one's step, path and problem; nothing is renamed).
  """
  candidates = sorted(
      ((step, rank, ckpt) for rank, ckpt in enumerate(checkpointers)
       for step in ckpt.all_steps()),
      key=lambda c: (-c[0], c[1]))
  failures = []  # (checkpointer, step, problem)
  for step, _, ckpt in candidates:
    path = ckpt.step_path(step)
    problems = ckpt.check(step)
    if problems:
      problem = integrity.summary(problems)
      logging.warning("Checkpoint of step %d (%s) is corrupt: %s. Trying an"
                      " older one.", step, path, problem)
      failures.append((ckpt, step, problem))
      continue
    try:
      state, data_state = ckpt.restore(abstract_state, step, migrate=migrate)
    except CheckpointMismatchError:
      raise
    except CheckpointError as e:
      logging.warning("%s Trying an older one.", e)
      failures.append((ckpt, step, str(e)))
      continue
    problem = check(state) if check is not None else None
    if problem:
      logging.warning("Checkpoint of step %d (%s) %s. Trying an older one.",
                      step, path, problem)
      failures.append((ckpt, step, problem))
      continue
    for bad_ckpt, bad_step, _ in failures:
      moved = bad_ckpt.quarantine(bad_step)
      logging.warning("Moved the unusable checkpoint of step %d to %s.",
                      bad_step, moved)
    return Restored(step=step, state=state, data_state=data_state, path=path,
                    tier=ckpt.tier)
  if failures:
    listed = "; ".join(f"step {step} ({ckpt.step_path(step)}): {problem}"
                       for ckpt, step, problem in failures)
    raise CheckpointError(
        f"No usable checkpoint: {listed}. Move these folders away to start"
        " from scratch.")
  return None
