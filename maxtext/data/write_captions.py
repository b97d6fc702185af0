r"""Writes the bundled image-caption set (`maxtext.data.caption_task`).

  tools/bazel run //maxtext/data:write_captions -- --out=data/captions \
      --count=512 --eval_count=64

writes <out>/captions.jsonl (--count records), <out>/captions_eval.jsonl
(--eval_count more, another seed) and their pictures under <out>/images/,
for configs/sft_vlm.py (data.files, data.eval_files, data.image_dir=<out>).
--out is written whole or not at all and must be new, empty or an earlier
set (replaced): `maxtext.common.exports`.
"""

from absl import app
from absl import flags

from maxtext.common import cli
from maxtext.common import exports
from maxtext.common import paths
from maxtext.data import caption_task

_OUT = flags.DEFINE_string("out", None, "Output folder (new or empty).")
_COUNT = flags.DEFINE_integer("count", 512, "Training records.",
                              lower_bound=1)
_EVAL_COUNT = flags.DEFINE_integer("eval_count", 64, "Evaluation records.",
                                   lower_bound=0)
_SIZE = flags.DEFINE_integer("size", 896, "Side of each picture, in pixels.",
                             lower_bound=1)
EVAL_RECORDS = "captions_eval.jsonl"
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the training pictures.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  with cli.errors_in_one_line("write_captions"):
    out = paths.user_path(_OUT.value)
    with exports.writing(out, kind="captions") as folder:
      caption_task.write(folder, _COUNT.value, seed=_SEED.value,
                         size=_SIZE.value)
      if _EVAL_COUNT.value:
        caption_task.write(folder, _EVAL_COUNT.value, seed=_SEED.value + 1,
                           size=_SIZE.value, start=_COUNT.value,
                           name=EVAL_RECORDS)
    print(f"Wrote {_COUNT.value} + {_EVAL_COUNT.value} captioned pictures "
          f"to {out}.")

if __name__ == "__main__":
  flags.mark_flag_as_required("out")
  app.run(main)
