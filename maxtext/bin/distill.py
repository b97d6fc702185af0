r"""Distils a teacher checkpoint into a student checkpoint on Tunix.

Teacher (--teacher) and student (--load) are converted or training
checkpoints of any families and sizes with the same tokenizer; the teacher
is frozen (optionally int8/nf4: --config.distill.teacher_qtype). The loss,
its schedules and the feature pairs are set in configs/distill.py. Metrics
go to --workdir/metrics.jsonl; the trained student to --workdir/export.

Example:

  tools/bazel run //maxtext/bin:distill -- --config=configs/distill.py \
      --load=ckpts/student --teacher=ckpts/teacher --workdir=runs/distill \
      --config.data.files=data/chat.jsonl \
      --config.data.tokenizer=ckpts/student/tokenizer.json

Exit status: 0 done; 1 an error, named in one line on stderr.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from maxtext.posttrain import distill
from maxtext.posttrain import runtime
from maxtext.trainers import config_flag
from maxtext.trainers import workdir as workdir_lib

_CONFIG = config_flag.define_config_file(
    "config", "Distillation config (configs/distill.py); override fields"
    " with --config.<section>.<key>=<value>.")
_LOAD = flags.DEFINE_string(
    "load", None, "The student's checkpoint (sets config.train.load).")
_TEACHER = flags.DEFINE_string(
    "teacher", None, "The teacher's checkpoint (sets config.distill.teacher).")
_WORKDIR = flags.DEFINE_string(
    "workdir", None,
    "Output directory; default runs/distill under the directory you run"
    " from.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if _TEACHER.value:
    config.distill.teacher = _TEACHER.value
  runtime.run_binary(
      "distill", distill.run, config,
      config_path=config_flags.get_config_filename(flags.FLAGS["config"]),
      load=_LOAD.value, workdir=_WORKDIR.value)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  sys.argv = workdir_lib.resolve_config_argv(sys.argv)
  app.run(main)
