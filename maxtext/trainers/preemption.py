"""Preemption: SIGTERM or Ctrl-C ends the run at the next step boundary,
checkpointed.

Schedulers (Kubernetes, Slurm, Cloud TPU maintenance) send SIGTERM some time
before they kill a job. `PreemptionHook` turns it into a clean stop: the
update in flight finishes, the loop ends as if the run were complete (so the
checkpoint hook saves that step and waits until it is durable), and
`preempted_at` tells the caller, which exits with `EXIT_CODE_PREEMPTED`.
Rerunning the same command resumes from that checkpoint, losing nothing.

One process: a Python handler of SIGTERM and SIGINT (Ctrl-C) sets a flag
that the loop reads after each update; a second Ctrl-C interrupts at once
(KeyboardInterrupt), saving nothing more. Several processes: they must stop
at the same update, so the hook asks JAX's preemption sync manager
(`multihost_utils.reached_preemption_sync_point`), which catches SIGTERM on
any process, tells the others through the coordination service, and makes
every process return True at the same step; Ctrl-C there interrupts as
Python does.

The post-training binaries, whose loop is Tunix's, use the same hook through
`maxtext.posttrain.runtime.train_until_stopped`.
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
  """Stops the loop at the first step boundary after SIGTERM or Ctrl-C.

  Attributes:
    preempted_at: The update after which the run stopped on a signal, or
      None.
  """

  def __init__(self):
    self.preempted_at: int | None = None
    self._signalled = threading.Event()
    self._previous_handlers = {}
    self._sync_point = False

  def _on_signal(self, signum: int, frame: Any) -> None:
    del frame
    if signum == signal.SIGINT and self._signalled.is_set():
      raise KeyboardInterrupt  # Asked twice: stop now.
    self._signalled.set()
    logging.warning("%s received: stopping after this update and saving a"
                    " checkpoint%s.", signal.Signals(signum).name,
                    "; press Ctrl-C again to stop now, saving nothing more"
                    if signum == signal.SIGINT else "")

  def on_begin(self, step: int, state: Any) -> None:
    if jax.process_count() > 1:
      self._sync_point = True  # JAX's preemption notifier owns SIGTERM.
      return
    if threading.current_thread() is not threading.main_thread():
      logging.warning("Not on the main thread: SIGTERM cannot be caught, a"
                      " preemption will not be checkpointed.")
      return
    for signum in (signal.SIGTERM, signal.SIGINT):
      self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

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
      logging.warning("Stopping after update %d and saving a checkpoint.",
                      step)
    return self.preempted_at is not None

  @property
  def signalled(self) -> bool:
    """Whether this process caught SIGTERM or Ctrl-C, even after the last
    step boundary was checked."""
    return self._signalled.is_set()

  def close(self) -> None:
    for signum, handler in self._previous_handlers.items():
      signal.signal(signum, handler)
    self._previous_handlers = {}
