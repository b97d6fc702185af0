r"""Writes the bundled image-caption set (`maxtext.data.caption_task`).

  tools/bazel run //maxtext/data:write_captions -- --out=data/captions \
      --count=512 --eval_count=64

writes <out>/captions.jsonl (--count records), <out>/captions_eval.jsonl
(--eval_count more, another seed) and their pictures under <out>/images/,
for configs/sft_vlm.py (data.files, data.eval_files, data.image_dir=<out>).
--out must be new or empty.
"""

import os

from absl import app
from absl import flags

from maxtext.common import cli
from maxtext.common import paths
from maxtext.data import caption_task

_OUT = flags.DEFINE_string("out", None, "Output folder (new or empty).")
_COUNT = flags.DEFINE_integer("count", 512, "Training records.")
_EVAL_COUNT = flags.DEFINE_integer("eval_count", 64, "Evaluation records.")
_SIZE = flags.DEFINE_integer("size", 896, "Side of each picture, in pixels.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the training pictures.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  with cli.errors_in_one_line("write_captions"):
    out = paths.user_path(_OUT.value)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
      raise ValueError(f"--out={out} exists and is not an empty folder; "
                       "give a new one.")
    for name, value in (("count", _COUNT.value), ("size", _SIZE.value)):
      if value < 1:
        raise ValueError(f"--{name}={value} must be >= 1.")
    train = caption_task.write(out, _COUNT.value, seed=_SEED.value,
                               size=_SIZE.value)
    written = [train]
    if _EVAL_COUNT.value > 0:
      written.append(caption_task.write(
          out, _EVAL_COUNT.value, seed=_SEED.value + 1, size=_SIZE.value,
          start=_COUNT.value, name="captions_eval.jsonl"))
    print("Wrote", ", ".join(written), "and their images in",
          os.path.join(out, caption_task.IMAGES))


if __name__ == "__main__":
  flags.mark_flag_as_required("out")
  app.run(main)
