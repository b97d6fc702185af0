"""Tests maxtext.posttrain.runtime's clean stop of a Tunix loop."""

import os
import signal

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.posttrain import runtime


class _Trainer:
  """Tunix's loop as far as a stop goes: it trains on batches until they
  end (then Tunix saves its last checkpoint)."""

  def __init__(self, signal_at: int, signum: int):
    self.signal_at = signal_at
    self.signum = signum
    self.trained = []

  def train(self, batches, eval_batches):
    del eval_batches
    for batch in batches:
      if batch == self.signal_at:
        os.kill(os.getpid(), self.signum)
      self.trained.append(batch)


class TrainUntilStoppedTest(parameterized.TestCase):

  @parameterized.product(signum=(signal.SIGTERM, signal.SIGINT),
                         every=(1, 3))
  def test_a_signal_ends_the_batches_at_the_next_update(self, signum, every):
    before = signal.getsignal(signum)
    trainer = _Trainer(signal_at=4, signum=signum)
    self.assertTrue(runtime.train_until_stopped(trainer, range(100), None,
                                                every=every))
    # Batch 4 is in update 5 (every=1) or 2 (every=3: batches 3-5); that
    # update finishes, nothing after it starts.
    self.assertEqual(trainer.trained, list(range(5 if every == 1 else 6)))
    self.assertIs(signal.getsignal(signum), before)

  def test_without_a_signal_every_batch_is_trained(self):
    trainer = _Trainer(signal_at=None, signum=signal.SIGTERM)
    self.assertFalse(runtime.train_until_stopped(trainer, range(7), None,
                                                 every=2))
    self.assertEqual(trainer.trained, list(range(7)))


  def test_a_signal_in_the_last_update_is_not_lost(self):
    # No boundary is checked after the last batch: the training finishes,
    # and the run still reports the signal (its export is left to a rerun).
    trainer = _Trainer(signal_at=6, signum=signal.SIGTERM)
    self.assertTrue(runtime.train_until_stopped(trainer, range(7), None,
                                                every=1))
    self.assertEqual(trainer.trained, list(range(7)))


if __name__ == "__main__":
  absltest.main()
