"""Tests plot_run on two workdirs written by the metrics writer: the PNG's
size, and every plotted line equals the metrics written."""

import contextlib
import io
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import flagsaver
from matplotlib import image

from maxtext.metrics import writers
from tools.plot_run import plot_run

# run -> step -> metrics; MFU unknown (None) in run "a", a resumed step 20 in
# run "b" (the later line wins).
_RUNS = {
    "a": {1: {"train/loss": 10.5, "train/learning_rate": 1e-4,
              "perf/tokens_per_s_per_device": 500.0, "perf/mfu": None},
          10: {"train/loss": 8.25, "train/learning_rate": 1e-3,
               "perf/tokens_per_s_per_device": 900.0, "perf/mfu": None}},
    "b": {1: {"train/loss": 10.0, "train/learning_rate": 2e-4,
              "perf/tokens_per_s_per_device": 1500.0, "perf/mfu": 0.25},
          20: {"train/loss": 9.0, "train/learning_rate": 2e-3,
               "perf/tokens_per_s_per_device": 1600.0, "perf/mfu": 0.5},
          30: {"train/loss": 7.5, "train/learning_rate": 1e-3,
               "perf/tokens_per_s_per_device": 1700.0, "perf/mfu": 0.75}},
}


class PlotRunTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    for name, steps in _RUNS.items():
      writer = writers.JsonlWriter(os.path.join(self.root, name))
      if name == "b":  # A run that died after step 20, then resumed.
        writer.write(20, {**steps[20], "train/loss": 99.0})
      for step, metrics in steps.items():
        writer.write(step, metrics)
      writer.close()

  def test_png_has_the_size_and_the_lines_of_the_metrics(self):
    output = os.path.join(self.root, "both.png")
    fig = plot_run.plot_runs([os.path.join(self.root, n) for n in _RUNS],
                             output)
    pixels = image.imread(output)
    width, height = plot_run.PANEL_SIZE
    self.assertEqual(pixels.shape[:2],
                     (2 * height * plot_run.DPI, 2 * width * plot_run.DPI))
    panels = [ax for ax in fig.axes if ax.get_visible()]
    self.assertEqual([ax.get_title() for ax in panels],
                     list(plot_run.DEFAULT_METRICS))
    for ax, key in zip(panels, plot_run.DEFAULT_METRICS):
      want = {}
      for name, steps in _RUNS.items():
        points = [(s, m[key]) for s, m in sorted(steps.items())
                  if m[key] is not None]
        if points:
          want[name] = points
      got = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata()))
             for line in ax.get_lines()}
      self.assertEqual(got, want, key)
      self.assertEqual([t.get_text() for t in ax.get_legend().get_texts()],
                       list(want))

  def test_binary_writes_next_to_the_run(self):
    self.enter_context(mock.patch.dict(
        os.environ, {"BUILD_WORKING_DIRECTORY": self.root}))
    stdout = io.StringIO()
    with flagsaver.flagsaver(workdir=["a"], metrics=["train/loss",
                                                      "perf/mfu", "eval/loss"]):
      with contextlib.redirect_stdout(stdout):
        plot_run.main(["plot_run"])
    output = os.path.join(self.root, "a", "metrics.png")
    self.assertEqual(stdout.getvalue().strip(), f"Wrote {output}")
    # Three panels in two columns; the fourth slot is empty.
    width, height = plot_run.PANEL_SIZE
    self.assertEqual(image.imread(output).shape[:2],
                     (2 * height * plot_run.DPI, 2 * width * plot_run.DPI))

  def test_missing_metrics_are_named(self):
    with self.assertRaisesRegex(FileNotFoundError, "nowhere/metrics.jsonl"):
      plot_run.plot_runs([os.path.join(self.root, "nowhere")],
                         os.path.join(self.root, "x.png"))


if __name__ == "__main__":
  absltest.main()
