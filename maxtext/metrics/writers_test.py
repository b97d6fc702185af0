"""Tests for maxtext.metrics.writers."""

import glob
import os
import struct

from absl import logging
from absl.testing import absltest
from tensorboardX.proto import event_pb2

from maxtext.metrics import writers


def _read_events(path: str) -> list[event_pb2.Event]:
  """Parses a TFRecord event file (length, crc, data, crc per record)."""
  events = []
  with open(path, "rb") as f:
    data = f.read()
  offset = 0
  while offset < len(data):
    (length,) = struct.unpack("<Q", data[offset:offset + 8])
    offset += 12
    events.append(event_pb2.Event.FromString(data[offset:offset + length]))
    offset += length + 4
  return events


class WritersTest(absltest.TestCase):

  def test_jsonl_round_trip_and_resume_overwrites(self):
    workdir = self.create_tempdir().full_path
    writer = writers.JsonlWriter(workdir)
    writer.write(1, {"train/loss": 5.0, "perf/mfu": None})
    writer.write(2, {"train/loss": float("nan"), "perf/mfu": 0.5})
    writer.close()
    writer = writers.JsonlWriter(workdir)  # A resumed run appends.
    writer.write(2, {"eval/loss": 4.5})  # Eval and train lines of a step.
    writer.write(2, {"train/loss": 4.0, "perf/mfu": 0.25})
    writer.close()
    self.assertEqual(
        writers.read_jsonl(os.path.join(workdir, "metrics.jsonl")),
        {1: {"train/loss": 5.0, "perf/mfu": None},
         2: {"eval/loss": 4.5, "train/loss": 4.0, "perf/mfu": 0.25}})

  def test_resume_cuts_a_torn_last_line(self):
    workdir = self.create_tempdir().full_path
    writer = writers.JsonlWriter(workdir)
    writer.write(1, {"train/loss": 5.0})
    writer.close()
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path, "a", encoding="utf-8") as f:
      f.write('{"step": 2, "train/lo')  # Killed mid-write.
    writer = writers.JsonlWriter(workdir)
    writer.write(2, {"train/loss": 4.0})
    writer.close()
    self.assertEqual(writers.read_jsonl(path),
                     {1: {"train/loss": 5.0}, 2: {"train/loss": 4.0}})

  def test_a_torn_line_is_found_from_the_tail_whatever_its_length(self):
    path = self.create_tempfile("x.jsonl").full_path
    lines = b'{"step": 1}\n{"step": 2, "long": "' + b"x" * 300 + b'"}\n'
    for torn, want in ((b'{"st', lines), (b"", lines), (b"y" * 250, lines)):
      for block_bytes in (1, 7, 64, 1 << 16):
        with open(path, "wb") as f:
          f.write(lines + torn)
        writers.drop_torn_last_line(path, block_bytes)
        with open(path, "rb") as f:
          self.assertEqual(f.read(), want, (torn, block_bytes))
    with open(path, "wb") as f:
      f.write(b'{"step": 1, "tr')  # The only line, torn.
    writers.drop_torn_last_line(path, 4)
    self.assertEqual(os.path.getsize(path), 0)
    writers.drop_torn_last_line(os.path.join(os.path.dirname(path), "none"))

  def test_tensorboard_scalars(self):
    workdir = self.create_tempdir().full_path
    writer = writers.TensorBoardWriter(workdir)
    writer.write(3, {"train/loss": 2.5, "perf/mfu": None})
    writer.write(4, {"train/loss": 2.0})
    writer.close()
    (path,) = glob.glob(os.path.join(workdir, "tensorboard", "events.*"))
    scalars = [(e.step, v.tag, v.simple_value) for e in _read_events(path)
               for v in e.summary.value]
    self.assertEqual(scalars, [(3, "train/loss", 2.5), (4, "train/loss", 2.0)])

  def test_log_line_says_na(self):
    with self.assertLogs(level="INFO") as logs:
      logging.get_absl_logger().propagate = True
      writers.LogWriter().write(7, {"train/loss": 3.25, "perf/mfu": None})
    self.assertIn("step 7 | train/loss=3.2500 | perf/mfu=n/a",
                  "\n".join(logs.output))

  def test_files_only_on_the_main_process(self):
    workdir = self.create_tempdir().full_path
    writer = writers.make_writers(workdir, tensorboard=True,
                                  is_main_process=False)
    writer.write(1, {"train/loss": 1.0})
    writer.close()
    self.assertEmpty(os.listdir(workdir))
    writer = writers.make_writers(workdir, tensorboard=True)
    writer.write(1, {"train/loss": 1.0})
    writer.close()
    self.assertCountEqual(os.listdir(workdir), ["metrics.jsonl",
                                                "tensorboard"])


if __name__ == "__main__":
  absltest.main()
