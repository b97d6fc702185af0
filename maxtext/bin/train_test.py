"""Tests the train binary: flags, default workdir, and one-line errors.

Bad input (a misspelt key, an impossible mesh, a missing tokenizer, data
file or workdir, a checkpoint of another model, a workdir-escaping path, a
full disk) must end the run with one line naming the bad value, exit status
1, and nothing written before lost. (Bad command-line overrides are flag
errors: config_flag_test.)

`DamagedFilesTest` is the catalogue of damaged files: every file the run
reads or writes (the workdir's config, data files, the tokenizer, the lock,
checkpoint files, the metric logs), empty, truncated, garbage, a folder, a
dangling link or a link to a device, is refused in one line naming it, or
passed over (an older checkpoint) or repaired (a torn log line), and
nothing earlier is lost.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
from unittest import mock
import warnings

from absl import flags
from absl.testing import absltest
from absl.testing import parameterized

from configs import gemma3
from maxtext.bin import train
from maxtext.checkpoint import integrity
from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.data import assets
from maxtext.common import workdir as workdir_lib
from maxtext.metrics import writers
from testing import train_process

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# A model that compiles and trains in seconds, on synthetic tokens.
_TINY = {
    "train.batch_size": 2, "data.seq_len": 16, "data.source": "synthetic",
    "model.vocab_size": 256, "model.num_layers": 1, "model.embed_dim": 32,
    "model.mlp_dim": 64, "model.num_heads": 2, "model.num_kv_heads": 1,
    "model.head_dim": 16, "model.query_pre_attn_scalar": 16.0,
    "logging.every_steps": 1, "logging.tensorboard": False,
}


def _config(**overrides):
  """The real gemma3 config with `_TINY` and `overrides` (`a__b=v` sets
  a.b)."""
  config = gemma3.get_config()
  values = {**_TINY, **{k.replace("__", "."): v for k, v in overrides.items()}}
  for key, value in values.items():
    *path, field = key.split(".")
    node = config
    for part in path:
      node = node[part]
    node[field] = value
  return config


class _Runs:
  """Runs of the binary, in this process."""

  def _run(self, config, workdir: str) -> str | None:
    """`train.run`; returns its one-line error, or None on success."""
    try:
      train.run(config, workdir)
    except SystemExit as e:
      return e.code
    return None

  def _assert_error(self, message: str | None, *fragments: str) -> None:
    self.assertIsInstance(message, str)
    self.assertNotIn("\n", message)
    self.assertTrue(message.startswith("train: error: "), message)
    for fragment in fragments:
      self.assertIn(fragment, message)


class TrainBinaryTest(_Runs, absltest.TestCase):

  def test_trains_into_the_default_workdir_with_the_users_paths(self):
    # As under `bazel run`: the current directory is the runfiles, and
    # every path the user typed means a path in BUILD_WORKING_DIRECTORY.
    user_dir = self.create_tempdir()
    lines = "".join(json.dumps({"text": f"Line {i} of the play."}) + "\n"
                    for i in range(40))
    user_dir.create_file("data/train.jsonl", content=lines)
    user_dir.create_file("data/eval.jsonl", content=lines)
    os.makedirs(os.path.join(user_dir.full_path, "tok"))
    shutil.copy(assets.default_tokenizer(),
                os.path.join(user_dir.full_path, "tok", "spm.model"))
    argv = [
        "train", "--config=configs/gemma3.py:small",
        "--config.train.steps=2", "--config.train.batch_size=2",
        "--config.data.seq_len=16", "--config.model.num_layers=1",
        "--config.logging.every_steps=1", "--config.data.source=jsonl",
        "--config.data.files=data/train*.jsonl",
        "--config.data.tokenizer=tok/spm.model",
        "--config.data.eval_files=data/eval.jsonl",
        "--config.data.eval_every_steps=2", "--config.data.eval_steps=1",
    ]
    # The config flag finds its overrides in sys.argv, as under app.run.
    with mock.patch.object(sys, "argv", argv), warnings.catch_warnings():
      # ml_collections loads config files with the deprecated load_module.
      warnings.filterwarnings("ignore", message=".*load_module",
                              category=DeprecationWarning)
      argv = flags.FLAGS(argv)
    self.assertNotEqual(os.getcwd(), user_dir.full_path)
    with mock.patch.dict(os.environ,
                         {"BUILD_WORKING_DIRECTORY": user_dir.full_path}):
      train.main(argv)
    self.assertEqual(flags.FLAGS.config.data.files, "data/train*.jsonl")
    workdir = os.path.join(user_dir.full_path, "runs", "gemma3_small")
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
    self.assertEqual(config["train"]["steps"], 2)
    self.assertEqual(config["model"]["num_layers"], 1)
    self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    self.assertEqual(sorted(metrics), [1, 2])
    self.assertIn("train/loss", metrics[1])
    self.assertGreater(metrics[2]["eval/tokens"], 0)
    self.assertGreater(metrics[2]["goodput/percent"], 0)

  def test_extra_arguments_are_rejected(self):
    with self.assertRaisesRegex(Exception, "Unexpected arguments"):
      train.main(["train", "stray"])

  def test_misspelt_key_in_a_config_file_gets_a_suggestion(self):
    config = _config()
    config.unlock()
    config.optimizer.learnin_rate = 1e-3  # A typo in a config file.
    message = self._run(config, self.create_tempdir().full_path)
    self._assert_error(message, "'optimizer.learnin_rate'",
                       "did you mean 'optimizer.learning_rate'")

  def test_impossible_mesh(self):
    message = self._run(_config(mesh__ici__data=1, mesh__ici__tensor=3),
                        self.create_tempdir().full_path)
    self._assert_error(message, "ValueError", "tensor", "3")

  def test_missing_tokenizer(self):
    missing = os.path.join(self.create_tempdir().full_path, "tok.model")
    message = self._run(_config(data__source="text", data__tokenizer=missing),
                        self.create_tempdir().full_path)
    self._assert_error(message, missing)

  def test_missing_data_files(self):
    missing = os.path.join(self.create_tempdir().full_path, "*.txt")
    message = self._run(_config(data__source="text", data__files=missing,
                                model__vocab_size=32768),
                        self.create_tempdir().full_path)
    self._assert_error(message, "FileNotFoundError", missing)

  def test_workdir_that_is_a_file(self):
    not_a_dir = self.create_tempfile("run").full_path
    self._assert_error(self._run(_config(), not_a_dir), not_a_dir)

  def test_a_busy_workdir_is_refused_before_any_work(self):
    workdir = self.create_tempdir().full_path
    with workdir_lib.exclusive(workdir):  # Another run holds it.
      message = self._run(_config(), workdir)
    self._assert_error(message, "WorkdirBusyError: Workdir", workdir,
                       f"in use by another run (pid {os.getpid()} on")
    self.assertEqual(os.listdir(workdir), [".lock"])  # Nothing written.

  def test_local_tier_outside_the_workdir_is_refused(self):
    workdir = self.create_tempdir().full_path
    message = self._run(_config(checkpoint__local_dir="../elsewhere",
                                checkpoint__local_every_steps=1), workdir)
    self._assert_error(message, "checkpoint.local_dir='../elsewhere'",
                       f"inside the workdir {workdir}")
    self.assertEqual(os.listdir(workdir), [".lock"])  # Nothing but the lock.

  def test_checkpoint_of_another_model_and_full_disk_lose_nothing(self):
    workdir = self.create_tempdir().full_path
    self.assertIsNone(self._run(_config(train__steps=1), workdir))
    # Another model shape in the same workdir.
    message = self._run(_config(train__steps=2, model__mlp_dim=48), workdir)
    self._assert_error(message, "CheckpointMismatchError",
                       os.path.join(workdir, "checkpoints", "1"),
                       "a different model or optimizer: params/",
                       "64) in the checkpoint, (1, 32, 48) in the model")
    # The disk fills while step 2 is saved.
    original = integrity.write_manifest

    def fill_disk_at_step_2(path):
      if os.path.basename(path).startswith("2."):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
      return original(path)

    with mock.patch.object(integrity, "write_manifest", fill_disk_at_step_2):
      message = self._run(_config(train__steps=3, checkpoint__every_steps=1),
                          workdir)
    self._assert_error(
        message, "CheckpointError", "Writing the persistent checkpoint"
        f" {os.path.join(workdir, 'checkpoints', '2')} failed",
        "No space left on device", "intact: steps [1]")
    # With space again, the run resumes from step 1 and finishes.
    self.assertIsNone(self._run(_config(train__steps=3), workdir))
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME),
        max_to_keep=3, async_save=False)
    self.addCleanup(ckpt.close)
    self.assertEqual(ckpt.all_steps(), [1, 3])
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    self.assertEqual(sorted(metrics), [1, 2, 3])

  def test_the_binary_prints_one_line_and_no_traceback(self):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run(
        train_process.module_argv("maxtext.bin.train") + [
            f"--config={_ROOT}/configs/gemma3.py:small",
            f"--workdir={self.create_tempdir().full_path}",
            *(f"--config.{k}={v}" for k, v in _TINY.items()),
            "--config.mesh.ici.data=1", "--config.mesh.ici.tensor=3"],
        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=300,
        check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-3000:])
    self.assertNotIn("Traceback", result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    self.assertTrue(last.startswith("train: error: ValueError: "), last)
    self.assertIn("tensor", last)

  def test_a_second_run_loads_its_train_step_from_the_cache(self):
    first, second = (self.create_tempdir().full_path for _ in range(2))
    env = train_process.cache_env()
    cache = os.path.join(first, "compilation_cache")  # The default.
    hit = train_process.cache_hit("jit_train_step")

    def train(workdir, flags=None):
      result = subprocess.run(
          train_process.train_argv(workdir, {"train.steps": 2}, flags),
          cwd=_ROOT, env=env, capture_output=True, text=True, timeout=300,
          check=False)
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      self.assertEqual(sorted(train_process.losses(workdir)), [1, 2])
      return result.stderr

    first_log = train(first)
    self.assertNotIn(hit, first_log)
    # The binary re-executed itself under the bundled mimalloc.
    self.assertIn("host malloc mimalloc.", first_log)
    self.assertTrue(train_process.cached(cache, "jit_train_step"))
    self.assertIn(hit, train(second, {"compilation_cache_dir": cache}))


def _damage(path: str, how: str) -> None:
  """Damages the file at `path` as a crash, a full disk or a user might."""
  if how == "folder":
    os.remove(path)
    os.mkdir(path)
  elif how == "dangling link":
    os.remove(path)
    os.symlink(path + ".gone", path)
  elif how == "device link":
    os.remove(path)
    os.symlink("/dev/zero", path)
  else:
    with open(path, "rb") as f:
      data = f.read()
    with open(path, "wb") as f:
      f.write({"empty": b"", "truncated": data[:len(data) // 2],
               "garbage": b"\x00\xff garbage \xfe" * 8}[how])


class DamagedFilesTest(_Runs, parameterized.TestCase):
  """The catalogue: each file `train` reads or writes, damaged each way, is
  refused in one line naming it, or repaired, and nothing earlier is lost."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # A finished 2-step run, checkpointed after each update: each case
    # damages a copy of it.
    cls.trained = os.path.join(absltest.get_default_test_tmpdir(), "trained")
    message = _Runs()._run(_config(train__steps=2, checkpoint__every_steps=1),
                           cls.trained)
    assert message is None, message

  def _copy(self) -> str:
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    shutil.copytree(self.trained, workdir, symlinks=True)
    os.remove(os.path.join(workdir, workdir_lib.LOCK_FILENAME))
    return workdir

  def _files(self, folder: str) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(folder):
      for name in names:
        path = os.path.join(root, name)
        if os.path.isfile(path):
          with open(path, "rb") as f:
            out[os.path.relpath(path, folder)] = f.read()
    return out

  def _refused(self, config, workdir: str, *fragments: str) -> None:
    """The run fails in one line naming `fragments`; `workdir` is as it was
    (bar its lock file)."""
    before = self._files(workdir) if os.path.isdir(workdir) else {}
    message = self._run(config, workdir)
    self._assert_error(message, *fragments)
    after = self._files(workdir) if os.path.isdir(workdir) else {}
    after.pop(workdir_lib.LOCK_FILENAME, None)
    before.pop(workdir_lib.LOCK_FILENAME, None)
    self.assertEqual(sorted(after), sorted(before))
    self.assertEqual(after, before)

  @parameterized.parameters(
      ("empty", "is not valid JSON"), ("truncated", "is not valid JSON"),
      ("garbage", "is not UTF-8 text"), ("folder", "Is a directory"),
      ("dangling link", "is a dangling link"),
      ("device link", "is not a regular file"))
  def test_the_workdirs_config(self, how, reason):
    workdir = self._copy()
    path = os.path.join(workdir, workdir_lib.CONFIG_FILENAME)
    _damage(path, how)
    self._refused(_config(train__steps=3, checkpoint__every_steps=1),
                  workdir, path, "cannot be read", reason)

  @parameterized.parameters("empty", "blank lines", "device link", "folder",
                            "dangling link")
  def test_a_data_file(self, how):
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, "train.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write(" \n\n\t\n" if how == "blank lines" else "Some text.\n")
    if how != "blank lines":
      _damage(path, how)
    self._refused(_config(data__source="text", data__files=path,
                          model__vocab_size=32768),
                  os.path.join(folder, "run"), path)

  @parameterized.parameters("empty", "truncated", "garbage", "folder",
                            "dangling link", "device link")
  def test_the_tokenizer(self, how):
    folder = self.create_tempdir()
    path = os.path.join(folder.full_path, "tokenizer.model")
    shutil.copyfile(assets.default_tokenizer(), path)
    _damage(path, how)
    text = folder.create_file("train.txt", content="Some text.\n").full_path
    self._refused(_config(data__source="text", data__files=text,
                          data__tokenizer=path, model__vocab_size=32768),
                  os.path.join(folder.full_path, "run"), path)

  def test_a_lock_file_that_is_a_folder(self):
    workdir = self._copy()
    path = os.path.join(workdir, workdir_lib.LOCK_FILENAME)
    os.mkdir(path)
    self._refused(_config(train__steps=3), workdir, path)

  @parameterized.parameters("empty", "truncated", "garbage", "folder",
                            "dangling link", "device link")
  def test_the_latest_checkpoints_files(self, how):
    # The manifest or a state file of step 2: step 1 is used and step 2
    # set aside for the run to save again.
    workdir = self._copy()
    step_2 = os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME, "2")
    target = (integrity.MANIFEST_FILENAME
              if how in ("empty", "garbage", "device link")
              else max(integrity.read_manifest(step_2),
                       key=lambda n: len(n)))
    _damage(os.path.join(step_2, target), how)
    step_1 = self._files(os.path.join(workdir, "checkpoints", "1"))
    with self.assertLogs(level="WARNING") as logs:
      self.assertIsNone(self._run(
          _config(train__steps=3, checkpoint__every_steps=1), workdir))
    self.assertTrue(any("Checkpoint of step 2" in line and "corrupt" in line
                        for line in logs.output), logs.output)
    checkpoints = os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME)
    steps = sorted(n for n in os.listdir(checkpoints) if n.isdigit())
    self.assertEqual(steps, ["1", "2", "3"])  # 2 saved again.
    [set_aside] = set(os.listdir(checkpoints)) - set(steps)
    self.assertTrue(set_aside.startswith("2" + checkpoint_lib.CORRUPT_MARK))
    self.assertEqual(self._files(os.path.join(checkpoints, "1")), step_1)

  def test_logs_torn_by_a_killed_run_are_repaired(self):
    workdir = self._copy()
    for name in ("metrics.jsonl", "goodput.jsonl"):
      with open(os.path.join(workdir, name), "a", encoding="utf-8") as f:
        f.write('{"step": 3, "tra')
    self.assertIsNone(self._run(
        _config(train__steps=3, checkpoint__every_steps=1), workdir))
    self.assertEqual(sorted(writers.read_jsonl(
        os.path.join(workdir, "metrics.jsonl"))), [1, 2, 3])
    with open(os.path.join(workdir, "goodput.jsonl"), encoding="utf-8") as f:
      self.assertEqual({json.loads(line)["run"] for line in f}, {1, 2})


if __name__ == "__main__":
  absltest.main()
