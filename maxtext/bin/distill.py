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

from maxtext.common import host_memory

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
from absl import flags

from maxtext.posttrain import distill
from maxtext.posttrain import binary

_FLAGS = binary.define_binary_flags(
    config_help="Distillation config (configs/distill.py)",
    load_help="The student's checkpoint (sets config.train.load).",
    default_workdir="runs/distill")
_TEACHER = flags.DEFINE_string(
    "teacher", None, "The teacher's checkpoint (sets config.distill.teacher).")


def _teacher_into(config) -> None:
  if _TEACHER.value:
    config.distill.teacher = _TEACHER.value


main = binary.binary_main("distill", distill.run, _FLAGS,
                           before_run=_teacher_into)


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-distill`."""
  binary.start_binary(main)


if __name__ == "__main__":
  console_main()
