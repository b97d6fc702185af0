"""Tests goodput accounting through the real training loop with a fake clock:
a run that fails after its checkpoint at update 4, then a run resumed from
it; every span and the restart loss equal the hand-computed times."""

import os

from absl.testing import absltest

from maxtext.metrics import goodput
from maxtext.metrics import writers
from maxtext.trainers import loop

# Seconds each thing takes on the fake clock.
_SETUP, _COMPILE, _BATCH, _UPDATE, _SAVE = 2.0, 3.0, 0.25, 1.0, 0.5


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


class _Checkpoint(loop.Hook):
  """Takes _SAVE seconds every 2 updates and at the end."""

  every = 2

  def __init__(self, clock):
    self.clock = clock

  def after_step(self, step, state):
    if self.due(step):
      self.clock.now += _SAVE

  def on_end(self, step, state):
    self.clock.now += _SAVE


class GoodputTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.workdir = self.create_tempdir().full_path
    self.clock = _Clock()

  def _batches(self):
    while True:
      self.clock.now += _BATCH
      yield None

  def _run(self, *, start_step, total_steps, fail_at=None):
    """One run of the train binary, as pretrain wires the recorder."""
    recorder = goodput.GoodputRecorder(self.workdir, clock=self.clock)
    self.clock.now += _SETUP + _COMPILE
    recorder.add("compile", _COMPILE)

    def step_fn(state, batch):
      del batch
      self.clock.now += _UPDATE
      if state + 1 == fail_at:
        raise RuntimeError("device lost")
      return state + 1, {}

    writer = writers.JsonlWriter(self.workdir)
    hook = goodput.GoodputHook(recorder, writer=writer)
    try:
      loop.run_loop(
          start_step, step_fn, recorder.timed_batches(self._batches()),
          start_step=start_step, total_steps=total_steps,
          hooks=[goodput.TimedHook(_Checkpoint(self.clock), recorder,
                                   "checkpoint"), hook])
    finally:
      writer.close()
    return hook.summary

  def test_spans_and_restart_loss_across_a_failure(self):
    with self.assertRaisesRegex(RuntimeError, "device lost"):
      self._run(start_step=0, total_steps=6, fail_at=5)
    # Resumed from the checkpoint of update 4.
    summary = self._run(start_step=4, total_steps=6)

    # Run 1 kept updates 1-4 with 2 saves; update 5 (its batch and the
    # failed update) is lost. Run 2 did updates 5-6, a save at 6 and the
    # final one.
    want = {"init": 2 * _SETUP, "compile": 2 * _COMPILE,
            "data_wait": 6 * _BATCH, "step": 6 * _UPDATE,
            "checkpoint": 4 * _SAVE, "eval": 0.0,
            "restart_loss": _BATCH + _UPDATE}
    self.assertEqual(summary.runs, 2)
    for name, seconds in want.items():
      self.assertAlmostEqual(summary.seconds[name], seconds, msg=name)
    total = sum(want.values())
    self.assertAlmostEqual(summary.total_s, total)
    self.assertAlmostEqual(summary.percent, 100 * 6 * _UPDATE / total)
    print(summary.describe())

    metrics = writers.read_jsonl(os.path.join(self.workdir, "metrics.jsonl"))
    self.assertEqual(metrics[6], summary.metrics())
    records = goodput.read_records(os.path.join(self.workdir,
                                                goodput.FILENAME))
    # Run 1: loop start, saves at 2 and 4, the failure (in update 5);
    # run 2: loop start, save at 6, end.
    self.assertEqual([(r["run"], r["step"]) for r in records],
                     [(1, 0), (1, 2), (1, 4), (1, 5), (2, 4), (2, 6), (2, 6)])
    for record in records:
      self.assertAlmostEqual(
          record["elapsed_s"],
          sum(record[f"{name}_s"] for name in goodput.SPANS))

  def test_a_line_torn_by_a_killed_run_is_cut_on_resume(self):
    self._run(start_step=0, total_steps=2)
    path = os.path.join(self.workdir, goodput.FILENAME)
    with open(path, "a", encoding="utf-8") as f:
      f.write('{"run": 1, "step": 2, "elaps')  # Killed mid-write.
    summary = self._run(start_step=2, total_steps=4)
    self.assertEqual(summary.runs, 2)
    self.assertEqual([(r["run"], r["step"]) for r in goodput.read_records(
        path)], [(1, 0), (1, 2), (1, 2), (2, 2), (2, 4), (2, 4)])

  def test_restart_from_an_older_checkpoint_loses_the_whole_run(self):
    self._run(start_step=4, total_steps=6)
    # Run 2 starts over from update 2: run 1's loop counts for nothing.
    summary = self._run(start_step=2, total_steps=4)
    run_1_loop = 2 * (_BATCH + _UPDATE) + 2 * _SAVE
    self.assertAlmostEqual(summary.seconds["restart_loss"], run_1_loop)
    self.assertAlmostEqual(summary.seconds["step"], 2 * _UPDATE)
    # Run 1's init and compile count as such.
    self.assertAlmostEqual(summary.seconds["init"], 2 * _SETUP)

  def test_non_writing_process_and_bad_span(self):
    recorder = goodput.GoodputRecorder(self.workdir, write=False,
                                       clock=self.clock)
    recorder.begin_loop(0)
    recorder.record(1)
    self.assertFalse(os.path.exists(os.path.join(self.workdir,
                                                 goodput.FILENAME)))
    with self.assertRaisesRegex(ValueError, "Unknown span 'saving'"):
      recorder.add("saving", 1.0)
    with self.assertRaisesRegex(ValueError, "No goodput records"):
      goodput.summarize([])


if __name__ == "__main__":
  absltest.main()
