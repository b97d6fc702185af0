r"""Plots the metrics of one or more training runs into a PNG.

Reads `<workdir>/metrics.jsonl` of each --workdir and draws one panel per
metric over the steps (default: loss, learning rate, tokens/s per device and
MFU), the runs overlaid, each labelled with its folder name. A metric a run
never logged (e.g. MFU on a device of unknown peak) is left out of its
panel. TensorBoard (`<workdir>/tensorboard`) stays the live view; this is
for looking at finished runs, side by side.

Example:

  tools/bazel run //tools/plot_run -- --workdir=runs/gemma3 \
      --workdir=runs/gemma3_lr3e-4 --output=runs/compare.png
"""

from collections.abc import Sequence
import math
import os

from absl import app
from absl import flags
from matplotlib import figure

from maxtext.common import paths
from maxtext.metrics import writers

DEFAULT_METRICS = ("train/loss", "train/learning_rate",
                   "perf/tokens_per_s_per_device", "perf/mfu")
# Size of one panel in inches, and the resolution.
PANEL_SIZE = (6.0, 4.0)
DPI = 100

_WORKDIR = flags.DEFINE_multi_string(
    "workdir", [], "A run's workdir (repeatable; the runs are overlaid).")
_METRICS = flags.DEFINE_list("metrics", list(DEFAULT_METRICS),
                             "Metric keys, one panel each.")
_OUTPUT = flags.DEFINE_string(
    "output", None, "PNG to write; default <first workdir>/metrics.png.")
_COLUMNS = flags.DEFINE_integer("columns", 2, "Panels per row.")

Series = dict[str, tuple[list[int], list[float]]]


def read_series(workdir: str, keys: Sequence[str]) -> Series:
  """{key: (steps, values)} of `<workdir>/metrics.jsonl`, in step order,
  steps without a value (or with null) left out.

  Raises:
    FileNotFoundError: the workdir has no metrics.jsonl (names it).
  """
  path = os.path.join(workdir, writers.JSONL_FILENAME)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} does not exist; is {workdir} the"
                            " workdir of a training run?")
  by_step = writers.read_jsonl(path)
  series = {}
  for key in keys:
    steps = [s for s in sorted(by_step) if by_step[s].get(key) is not None]
    series[key] = (steps, [by_step[s][key] for s in steps])
  return series


def make_figure(runs: dict[str, Series], keys: Sequence[str], *,
                columns: int = 2) -> figure.Figure:
  """One panel per key, one line per run (labelled by the `runs` key)."""
  if not keys:
    raise ValueError("No metrics to plot.")
  columns = max(1, min(columns, len(keys)))
  rows = math.ceil(len(keys) / columns)
  fig = figure.Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows),
                      dpi=DPI, layout="constrained")
  axes = fig.subplots(rows, columns, squeeze=False).ravel()
  for ax, key in zip(axes, keys):
    ax.set_title(key)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    plotted = False
    for label, series in runs.items():
      steps, values = series[key]
      if steps:
        ax.plot(steps, values, marker="." if len(steps) < 50 else None,
                label=label)
        plotted = True
    if not plotted:
      ax.text(0.5, 0.5, "no values", ha="center", va="center",
              transform=ax.transAxes, color="gray")
      ax.set_xticks([])
      ax.set_yticks([])
    elif len(runs) > 1:
      ax.legend()
  for ax in axes[len(keys):]:
    ax.set_visible(False)
  fig.suptitle(", ".join(runs))
  return fig


def plot_runs(workdirs: Sequence[str], output: str, *,
              keys: Sequence[str] = DEFAULT_METRICS,
              columns: int = 2) -> figure.Figure:
  """Writes the PNG of the runs in `workdirs` to `output`; the figure."""
  if not workdirs:
    raise ValueError("No workdir to plot.")
  runs = {}
  for workdir in workdirs:
    label = os.path.basename(os.path.normpath(workdir))
    while label in runs:  # Same folder name in two places.
      label += "'"
    runs[label] = read_series(workdir, keys)
  fig = make_figure(runs, keys, columns=columns)
  fig.savefig(output, format="png")
  return fig


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("Give at least one --workdir.")
  workdirs = [paths.user_path(w) for w in _WORKDIR.value]
  output = (paths.user_path(_OUTPUT.value) if _OUTPUT.value else
            os.path.join(workdirs[0], "metrics.png"))
  plot_runs(workdirs, output, keys=_METRICS.value, columns=_COLUMNS.value)
  print(f"Wrote {output}")


if __name__ == "__main__":
  app.run(main)
