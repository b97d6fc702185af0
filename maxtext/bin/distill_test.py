"""Tests the distill binary end to end: a qwen3 student distilled from a
llama3 teacher, and the one-line error for a config of another method."""

import os
import tempfile

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver

from maxtext.bin import distill
from maxtext.checkpoint import params_checkpoint
from maxtext.metrics import writers
from maxtext.posttrain import posttrain_testing as pt

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _argv() -> list[str]:
  return [
      "distill", f"--config={_ROOT}/configs/distill.py", "--load=ckpt",
      "--teacher=teacher/ckpt", "--workdir=run", "--config.train.steps=3",
      "--config.data.files=train.jsonl", "--config.data.seq_len=16",
      "--config.data.prefetch=0", "--config.sft.prompt_field=prompt",
      "--config.sft.completion_field=completion",
      "--config.data.tokenizer=hf/tokenizer.json",
      "--config.data.chat_template=template.jinja",
      "--config.distill.feature_layers=((0, 1),)",
      "--config.distill.beta=0.5", "--config.distill.beta_end=0.5",
      "--config.logging.tensorboard=false"]


class DistillBinaryTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.user_dir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    os.makedirs(os.path.join(cls.user_dir, "teacher"))
    pt.write_checkpoint(os.path.join(cls.user_dir, "teacher"), "llama3",
                        seed=1)
    pt.write_checkpoint(cls.user_dir, "qwen3", seed=2)
    pt.write_jsonl(os.path.join(cls.user_dir, "train.jsonl"),
                   pt.mapping_records(16))
    pt.template_file(cls.user_dir)
    cls.argv = pt.parse_binary_flags(_argv())

  def _main(self) -> None:
    pt.run_binary_main(distill.main, self.argv, self.user_dir)

  def test_distills_a_student_of_another_family(self):
    self._main()
    run = os.path.join(self.user_dir, "run")
    metrics = writers.read_jsonl(os.path.join(run, "metrics.jsonl"))
    self.assertEqual(sorted(metrics), [1, 2, 3])
    self.assertGreater(metrics[3]["train/distill/feature"], 0.0)
    cfg, _ = params_checkpoint.load_params(os.path.join(run, "export"))
    self.assertEqual(cfg.family, "qwen3")

  def test_a_missing_teacher_is_an_error(self):
    config = flags.FLAGS.config
    teacher, config.distill.teacher = config.distill.teacher, ""
    try:
      with flagsaver.flagsaver(teacher=None):
        with self.assertRaises(SystemExit) as caught:
          self._main()
    finally:
      config.distill.teacher = teacher
    self.assertEqual(caught.exception.code,
                     "distill: error: ValueError: distill.teacher is empty:"
                     " give the teacher's checkpoint.")


if __name__ == "__main__":
  absltest.main()
