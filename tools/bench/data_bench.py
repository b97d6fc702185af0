r"""Measures the input pipeline alone; prints figures, asserts nothing.

Builds the training pipeline of a config (sources, tokenizer, packing,
workers, prefetch; no model, no devices), reads `--warmup_batches` untimed,
then times `--batches` and prints tokens/s delivered (all tokens of the
batches) and target tokens/s (those with mask 1), and their ratio to what
the training run consumes (`--train_tokens_per_s`; the default is the
default gemma3 CPU run: batch 8 x 128 tokens at about 0.9 s per update).

Example:

  tools/bazel run //tools/bench:data_bench -- --config=configs/gemma3.py \
      --config.data.num_workers=2
"""

import sys
import time

from absl import app
from absl import flags
from ml_collections import config_flags

from maxtext.common import config_flag
from maxtext.common import paths
from maxtext.data import pipeline
from maxtext.trainers.config import ExperimentConfig

_CONFIG = config_flag.define_config_file(
    "config", "Config file and optional variant, e.g. configs/gemma3.py.")
_BATCHES = flags.DEFINE_integer("batches", 200, "Timed batches.",
                                lower_bound=1)
_WARMUP_BATCHES = flags.DEFINE_integer(
    "warmup_batches", 10, "Untimed batches read first (start-up, workers).",
    lower_bound=0)
_TRAIN_TOKENS_PER_S = flags.DEFINE_float(
    "train_tokens_per_s", 8 * 128 / 0.9,
    "Tokens/s the training run consumes, for the ratio.", lower_bound=0.0)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  experiment = ExperimentConfig.from_config_dict(config)
  data_config = experiment.data
  start = time.perf_counter()
  data = pipeline.make_train_pipeline(
      data_config, batch_size=experiment.train.batch_size,
      vocab_size=experiment.model.vocab_size)
  try:
    for _ in range(_WARMUP_BATCHES.value):
      next(data)
    startup_s = time.perf_counter() - start
    tokens = targets = 0
    start = time.perf_counter()
    for _ in range(_BATCHES.value):
      batch = next(data)
      tokens += batch["inputs"].size
      targets += int(batch["mask"].sum())
    elapsed = time.perf_counter() - start
  finally:
    data.close()
  tokens_per_s = tokens / elapsed
  rows = [
      ("config", config_flags.get_config_filename(flags.FLAGS["config"])),
      ("source", data_config.source),
      ("packing", data_config.packing),
      ("workers / prefetch", f"{data_config.num_workers} /"
                             f" {data_config.prefetch}"),
      ("batch x length", f"{experiment.train.batch_size} x"
                         f" {data_config.seq_len}"),
      ("start-up s", f"{startup_s:.2f} (incl. {_WARMUP_BATCHES.value}"
                     " warm-up batches)"),
      ("batches/s", f"{_BATCHES.value / elapsed:.1f}"),
      ("tokens/s", f"{tokens_per_s:.0f}"),
      ("target tokens/s", f"{targets / elapsed:.0f}"
                          f" ({100 * targets / tokens:.1f}% of tokens)"),
      ("training consumes", f"{_TRAIN_TOKENS_PER_S.value:.0f} tokens/s"),
      ("ratio", f"{tokens_per_s / _TRAIN_TOKENS_PER_S.value:.1f}x"
       if _TRAIN_TOKENS_PER_S.value else "n/a"),
  ]
  width = max(len(name) for name, _ in rows)
  for name, value in rows:
    print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  sys.argv = paths.resolve_config_argv(sys.argv)
  app.run(main)
