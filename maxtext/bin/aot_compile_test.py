"""Tests the aot_compile binary: report, fit check, --save (and `train
--compiled` running the saved step), --sweep, and the sft and grpo steps of
post-training configs.

Runs `python -m maxtext.bin.aot_compile` as a child process (the config flag
is parsed once per process). Needs libtpu.
"""

import json
import os
import subprocess
import zipfile

from absl.testing import absltest

from maxtext.posttrain import posttrain_testing
from testing import train_process

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# llama3's small config, shrunk.
_TINY = [f"--config={os.path.join(_ROOT, 'configs', 'llama3.py')}",
         "--config.model.num_layers=1", "--config.model.vocab_size=128",
         "--config.model.embed_dim=64", "--config.model.mlp_dim=128",
         "--config.model.head_dim=16", "--config.data.source=synthetic",
         "--config.data.seq_len=32", "--config.mesh.ici.data=1",
         "--config.mesh.ici.fsdp=-1"]
_TIMEOUT_S = 300


def _run(*args: str, binary: str = "aot_compile",
         devices: int | None = None,
         config: tuple[str, ...] = tuple(_TINY),
         user_dir: str | None = None) -> subprocess.CompletedProcess:
  """Runs `maxtext.bin.<binary>` with `config` (default: the tiny config)
  and `args` (stdout and stderr captured as text), on `devices` fake CPU
  devices if given, as `bazel run` from `user_dir` if given."""
  env = dict(os.environ)
  if user_dir:
    env["BUILD_WORKING_DIRECTORY"] = user_dir
  # No forced device count: the binary asks for cpu:N's devices itself.
  env.pop("JAX_NUM_CPU_DEVICES", None)
  if devices:
    env["JAX_NUM_CPU_DEVICES"] = str(devices)
  # Under Bazel the stub's PYTHONPATH is inherited; outside, the repo root.
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (_ROOT, env.get("PYTHONPATH")) if p)
  return subprocess.run(
      train_process.module_argv(f"maxtext.bin.{binary}") + [*config, *args],
      env=env, cwd=_ROOT, capture_output=True, text=True, timeout=_TIMEOUT_S,
      check=False)


class AotCompileTest(absltest.TestCase):

  def test_tpu_report_with_parameters(self):
    result = _run("--topology=v5e:2x2", "--parameters")
    self.assertEqual(result.returncode, 0, result.stderr)
    out = result.stdout
    self.assertIn("# llama3: mesh data=1 fsdp=4", out)
    self.assertIn("Train step on v5e:2x2: 4 x TPU v5 lite, mesh fsdp=4;", out)
    self.assertRegex(out, r"\ntotal +[\d,]+ +\d+\.\d\d\n")
    self.assertRegex(out, r"fits: \d+\.\d% of v5e HBM\.")
    self.assertIn("Collectives: ", out)

  def test_tpu_compiles_layer_kinds_in_groups_with_full_remat(self):
    """Gemma 4's small model's layers (two local layers and a global one,
    twice: two groups of each kind, each kind its own head size), shrunk,
    with full remat: libtpu aborted on the gradients of the strided slices
    the layer scan once took of each kind's stack."""
    config = (f"--config={os.path.join(_ROOT, 'configs', 'gemma4.py')}",
              "--config.model.vocab_size=512", "--config.model.embed_dim=64",
              "--config.model.mlp_dim=128", "--config.model.num_heads=2",
              "--config.model.num_kv_heads=1", "--config.model.head_dim=16",
              "--config.model.global_head_dim=32",
              "--config.model.sliding_window=16",
              "--config.remat.policy=full", "--config.data.source=synthetic",
              "--config.data.seq_len=64", "--config.train.batch_size=4",
              "--config.mesh.ici.data=1", "--config.mesh.ici.fsdp=-1")
    result = _run("--topology=v5e:2x2", config=config)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    self.assertRegex(result.stdout, r"fits: \d+\.\d% of v5e HBM\.")

  def test_a_step_that_does_not_fit_exits_with_the_reason(self):
    # One row of 64k tokens per device: the reference attention's float32
    # scores, 4 heads x 65536 x 65536, are 64 GiB per device, more than a
    # 1/8 share of this host's memory.
    result = _run("--topology=cpu:8", "--config.data.seq_len=65536")
    self.assertEqual(result.returncode, 1)
    self.assertIn("DOES NOT FIT", result.stdout)
    self.assertRegex(
        result.stderr,
        r"(?m)^aot_compile: error: DoesNotFitError: The train step needs"
        r" \d+\.\d\d GiB per device on cpu:8, .* more than the \d+\.\d\d GiB"
        r" of host memory / 8\. Shard the state")

  def test_save_writes_the_step_that_train_runs(self):
    """`--save` writes the step and its fingerprint; `train --compiled`
    runs it bit for bit like its own jit and refuses another config."""
    path = os.path.join(self.create_tempdir().full_path, "step.aot")
    train = ["--config.train.steps=3", "--config.checkpoint.every_steps=0",
             "--config.logging.every_steps=1"]
    result = _run("--topology=cpu:8", f"--save={path}", *train)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn("Train step on cpu:8: 8 x cpu,", result.stdout)
    self.assertIn(f"Saved the compiled step to {path}.", result.stdout)
    with zipfile.ZipFile(path) as archive:
      saved = json.loads(archive.read("fingerprint.json"))
      self.assertGreater(len(archive.read("executable.bin")), 0)
    self.assertEqual(saved["topology"]["num_devices"], 8)
    self.assertEqual(saved["config"]["model"]["num_layers"], 1)
    losses = []
    for extra in ([], [f"--compiled={path}"]):
      workdir = self.create_tempdir().full_path
      result = _run(*train, f"--workdir={workdir}", *extra, binary="train",
                    devices=8)
      self.assertEqual(result.returncode, 0, result.stderr)
      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        losses.append([json.loads(line)["train/loss"] for line in f
                       if "train/loss" in line])
    self.assertLen(losses[1], 3)
    self.assertEqual(losses[1], losses[0])  # The same program, bit for bit.

    result = _run(*train, "--config.train.batch_size=16",
                  f"--workdir={self.create_tempdir().full_path}",
                  f"--compiled={path}", binary="train", devices=8)
    self.assertEqual(result.returncode, 1)
    self.assertIn("config.train.batch_size: compiled for 8, this run 16",
                  result.stderr)

  def test_sweep_prints_the_ranked_layouts(self):
    result = _run("--topology=cpu:8", "--sweep", "--sweep_layout=fsdp=8",
                  "--sweep_layout=data=2,fsdp=4", "--sweep_remat=none")
    self.assertEqual(result.returncode, 0, result.stderr)
    lines = result.stdout.splitlines()
    self.assertEqual(lines[0].split()[:3], ["rank", "layout", "remat"])
    self.assertCountEqual([line.split()[1] for line in lines[1:]],
                          ["fsdp=8", "data=2,fsdp=4"])

  def test_sft_config_compiles_the_sft_step(self):
    folder = self.create_tempdir().full_path
    load = posttrain_testing.write_checkpoint(folder)
    # The checkpoint is named relative to the directory run from.
    sft_config = (f"--config={os.path.join(_ROOT, 'configs', 'sft.py')}:lora",
                  f"--config.train.load={os.path.relpath(load, folder)}",
                  "--config.data.files=unread.jsonl",
                  "--config.data.seq_len=32", "--config.mesh.ici.data=1",
                  "--config.mesh.ici.fsdp=-1")
    result = _run("--topology=v5e:2x2", config=sft_config, user_dir=folder)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn("Sft step (Tunix PeftTrainer) on v5e:2x2: 4 x TPU v5 lite,"
                  " mesh fsdp=4;", result.stdout)
    self.assertRegex(result.stdout, r"fits: \d+\.\d% of v5e HBM\.")
    result = _run("--topology=v5e:2x2", "--sweep", config=sft_config)
    self.assertEqual(result.returncode, 1)
    self.assertIn("--sweep and --parameters work with the train step; for the"
                  " post-training steps drop them.", result.stderr)

  def test_dpo_config_compiles_the_dpo_step(self):
    folder = self.create_tempdir().full_path
    load = posttrain_testing.write_checkpoint(folder)
    dpo_config = (f"--config={os.path.join(_ROOT, 'configs', 'dpo.py')}",
                  f"--config.train.load={os.path.relpath(load, folder)}",
                  "--config.data.files=unread.jsonl",
                  "--config.mesh.ici.data=1", "--config.mesh.ici.fsdp=-1")
    result = _run("--topology=v5e:2x2", config=dpo_config, user_dir=folder)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn("DPO step (Tunix DPOTrainer) on v5e:2x2: 4 x TPU v5 lite,",
                  result.stdout)
    result = _run("--topology=v5e:2x2", "--save=step.aot", config=dpo_config,
                  user_dir=folder)
    self.assertEqual(result.returncode, 1)
    self.assertIn("--save works with the train and sft steps, not"
                  " train.method='dpo': drop --save.", result.stderr)

  def test_grpo_config_compiles_the_grpo_step(self):
    grpo_config = (f"--config={os.path.join(_ROOT, 'configs', 'grpo.py')}",
                   "--config.mesh.ici.data=1", "--config.mesh.ici.fsdp=-1")
    result = _run("--topology=v5e:2x2", config=grpo_config)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn("GRPO step (Tunix GRPOLearner actor) on v5e:2x2: 4 x TPU"
                  " v5 lite, mesh fsdp=4;", result.stdout)
    self.assertRegex(result.stdout, r"fits: \d+\.\d% of v5e HBM\.")

  def test_bad_topology_is_one_line(self):
    result = _run("--topology=v9-8")
    self.assertEqual(result.returncode, 1)
    self.assertEqual(result.stderr.splitlines()[-1].split(": unknown")[0],
                     "aot_compile: error: ValueError: --topology='v9-8'")


if __name__ == "__main__":
  absltest.main()
