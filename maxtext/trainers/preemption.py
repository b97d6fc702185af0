"""Preemption: SIGTERM ends the run at the next step boundary, checkpointed.

Schedulers (Kubernetes, Slurm, Cloud TPU maintenance) send SIGTERM some time
before they kill a job. `PreemptionHook` turns it into a clean stop: the
update in flight finishes, the loop ends as if the run were complete (so the
checkpoint hook saves that step and waits until it is durable), and
`preempted_at` tells the caller, which exits with `EXIT_CODE_PREEMPTED`.
Rerunning the same command resumes from that checkpoint, losing nothing.

One process: a Python SIGTERM handler sets a flag that the loop reads after
each update. Several processes: they must stop at the same update, so the
hook asks JAX's preemption sync manager
(`multihost_utils.reached_preemption_sync_point`), which catches SIGTERM on
any process, tells the others through the coordination service, and makes
every process return True at the same step.
"""

import signal
import threading
from typing import Any

from absl import logging
import jax
from jax.experimental import multihost_utils

from maxtext.trainers import loop

# Exit status of a run that stopped on SIGTERM after saving its checkpoint:
# EX_TEMPFAIL of sysexits.h, "temporary failure, retry later". Distinct from
# 143 (128 + SIGTERM), which a shell reports when SIGTERM killed a process
# before it could save.
EXIT_CODE_PREEMPTED = 75


class PreemptionHook(loop.Hook):
  """Stops the loop at the first step boundary after SIGTERM.

  Attributes:
    preempted_at: The update after which the run stopped on SIGTERM, or None.
  """

  def __init__(self):
    self.preempted_at: int | None = None
    self._signalled = threading.Event()
    self._previous_handler = None
    self._sync_point = False

  def _on_sigterm(self, signum: int, frame: Any) -> None:
    del signum, frame
    self._signalled.set()

  def on_begin(self, step: int, state: Any) -> None:
    if jax.process_count() > 1:
      self._sync_point = True  # JAX's preemption notifier owns SIGTERM.
      return
    if threading.current_thread() is not threading.main_thread():
      logging.warning("Not on the main thread: SIGTERM cannot be caught, a"
                      " preemption will not be checkpointed.")
      return
    self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _reached(self, step: int) -> bool:
    if not self._sync_point:
      return self._signalled.is_set()
    try:
      return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError as e:  # The preemption service is disabled.
      logging.warning("Preemptions cannot be detected: %s", e)
      self._sync_point = False
      return False

  def should_stop(self, step: int) -> bool:
    if self.preempted_at is None and self._reached(step):
      self.preempted_at = step
      logging.warning("SIGTERM received: stopping after update %d and saving"
                      " a checkpoint.", step)
    return self.preempted_at is not None

  def close(self) -> None:
    if self._previous_handler is not None:
      signal.signal(signal.SIGTERM, self._previous_handler)
      self._previous_handler = None
