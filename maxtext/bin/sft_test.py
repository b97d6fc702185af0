"""Tests the sft binary end to end: LoRA SFT from a converted checkpoint to a
Hugging Face folder that transformers loads with our merged model's logits;
bad input ends in one line."""

import os
import shutil
import subprocess
import tempfile

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from maxtext.bin import sft
from maxtext.checkpoint import params_checkpoint
from maxtext.common import workdir as workdir_lib
from maxtext.metrics import writers
from maxtext.posttrain import posttrain_testing as pt
from testing import train_process

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_TOKENS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]]


def _argv(*extra: str) -> list[str]:
  return [
      "sft", f"--config={_ROOT}/configs/sft.py:lora", "--load=ckpt",
      "--workdir=run", "--config.train.steps=6",
      "--config.data.files=train.jsonl", "--config.data.packing=none",
      "--config.data.seq_len=16", "--config.data.prefetch=0",
      "--config.sft.prompt_field=prompt",
      "--config.sft.completion_field=completion",
      "--config.data.tokenizer=hf/tokenizer.json",
      "--config.data.chat_template=template.jinja",
      "--config.optimizer.learning_rate=0.03",
      "--config.optimizer.warmup_steps=0", "--config.export.hf=true",
      "--config.logging.tensorboard=false", *extra]


class SftBinaryTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.user_dir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    pt.write_checkpoint(cls.user_dir)
    pt.write_jsonl(os.path.join(cls.user_dir, "train.jsonl"),
                   pt.mapping_records(32))
    pt.template_file(cls.user_dir)
    cls.argv = pt.parse_binary_flags(_argv())

  def _main(self) -> None:
    pt.run_binary_main(sft.main, self.argv, self.user_dir)

  def test_lora_sft_exports_what_transformers_loads(self):
    self._main()
    run = os.path.join(self.user_dir, "run")
    metrics = writers.read_jsonl(os.path.join(run, "metrics.jsonl"))
    self.assertLess(metrics[6]["train/loss"], metrics[1]["train/loss"])
    ours = params_checkpoint.model_from_params(
        *params_checkpoint.load_params(os.path.join(run, "export")))
    want = np.asarray(ours(jnp.asarray(_TOKENS)))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(run, "hf"))
    original = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(self.user_dir, "hf"))
    with torch.no_grad():
      got = hf_model(torch.tensor(_TOKENS)).logits.numpy()
      before = original(torch.tensor(_TOKENS)).logits.numpy()
    diff = float(np.abs(got - want).max())
    print(f"sft --config.export.hf: transformers vs ours, max |logit diff| ="
          f" {diff:.2g}; change from training {np.abs(got - before).max():.3g}")
    self.assertLess(diff, 1e-4)
    self.assertGreater(float(np.abs(got - before).max()), 1e-2)
    self.assertTrue(os.path.isfile(os.path.join(run, "hf", "tokenizer.json")))

  def test_bad_input_ends_in_one_line(self):
    data = flags.FLAGS.config.data
    template, data.chat_template = data.chat_template, ""
    try:
      with self.assertRaises(SystemExit) as caught:
        self._main()
    finally:
      data.chat_template = template
    message = caught.exception.code
    self.assertNotIn("\n", message)
    self.assertTrue(message.startswith(
        "sft: error: ValueError: SFT needs data.chat_template"), message)

  def test_a_file_that_is_no_saved_step_ends_in_one_line(self):
    with open(os.path.join(self.user_dir, "step.zip"), "wb") as f:
      f.write(b"PK\x03\x04 truncated")
    with flagsaver.flagsaver(compiled="step.zip", workdir="notastep"):
      with self.assertRaises(SystemExit) as caught:
        self._main()
    message = caught.exception.code
    self.assertNotIn("\n", message)
    self.assertTrue(message.startswith(
        f"sft: error: OSError: {self.user_dir}/step.zip is not a train step"
        " saved by aot_compile --save"), message)

  def test_a_busy_workdir_is_refused_before_any_work(self):
    busy = os.path.join(self.user_dir, "busy")
    with workdir_lib.exclusive(busy):  # Another run holds it.
      with flagsaver.flagsaver(workdir="busy"):
        with self.assertRaises(SystemExit) as caught:
          self._main()
    message = caught.exception.code
    self.assertNotIn("\n", message)
    self.assertTrue(message.startswith(
        f"sft: error: WorkdirBusyError: Workdir {busy} is in use by another"
        f" run (pid {os.getpid()}"), message)
    self.assertEqual(sorted(os.listdir(busy)), [".lock"])  # Nothing written.

  def test_loading_its_own_export_is_refused_before_training(self):
    workdir = os.path.join(self.user_dir, "selfload")
    shutil.copytree(os.path.join(self.user_dir, "ckpt"),
                    os.path.join(workdir, "export"))
    with flagsaver.flagsaver(workdir="selfload", load="selfload/export"):
      with self.assertRaises(SystemExit) as caught:
        self._main()
    message = caught.exception.code
    self.assertEqual(
        message, "sft: error: ExportTargetError: The export to"
        f" {workdir}/export would overwrite its own input {workdir}/export;"
        " choose another output folder.")
    self.assertEqual(sorted(os.listdir(os.path.join(workdir, "export"))),
                     sorted(os.listdir(os.path.join(self.user_dir, "ckpt"))))

  def test_a_rerun_loads_its_train_step_from_the_cache(self):
    env = train_process.cache_env()
    env["BUILD_WORKING_DIRECTORY"] = self.user_dir  # The relative paths.
    hit = train_process.cache_hit("jit_posttrain_step")

    def sft_run(workdir, *extra):
      result = subprocess.run(
          train_process.module_argv("maxtext.bin.sft") +
          _argv(f"--workdir={workdir}", *extra)[1:],
          cwd=self.user_dir, env=env, capture_output=True, text=True,
          timeout=300, check=False)
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      metrics = writers.read_jsonl(
          os.path.join(self.user_dir, workdir, "metrics.jsonl"))
      return result.stderr, [metrics[step]["train/loss"] for step in
                             range(1, 7)]

    log, losses = sft_run("cached_1")
    self.assertNotIn(hit, log)
    cache = os.path.join(self.user_dir, "cached_1", "compilation_cache")
    self.assertTrue(train_process.cached(cache, "jit_posttrain_step"))
    # Another workdir, the first's cache: the same updates, not compiled.
    log, again = sft_run("cached_2",
                         "--compilation_cache_dir=cached_1/compilation_cache")
    self.assertIn(hit, log)
    self.assertEqual(again, losses)

  def test_extra_arguments_are_rejected(self):
    with self.assertRaisesRegex(Exception, "Unexpected arguments"):
      sft.main(["sft", "stray"])


if __name__ == "__main__":
  absltest.main()
