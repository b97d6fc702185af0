"""Tests for maxtext.checkpoint.manager: saving, tiers, corruption, errors."""

import errno
import glob
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.checkpoint import integrity
from maxtext.checkpoint import manager
from maxtext.checkpoint import tiers
from maxtext.checkpoint.checkpoint_config import CheckpointConfig


def _state(seed: int):
  rng = np.random.default_rng(seed)
  params = {"layer": {"kernel": jnp.asarray(rng.normal(size=(4, 3)),
                                            jnp.float32),
                      "scale": jnp.asarray(rng.normal(size=(3,)),
                                           jnp.bfloat16)}}
  tx = optax.adamw(1e-3)
  return {"step": jnp.asarray(seed, jnp.int32), "params": params,
          "opt_state": tx.init(params)}


def _abstract(state):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      state)


def _flip_byte(path: str, offset: int = 0) -> None:
  with open(path, "r+b") as f:
    f.seek(offset)
    byte = f.read(1)
    f.seek(offset)
    f.write(bytes([byte[0] ^ 0xFF]))


def _largest_file(step_dir: str) -> str:
  files = [p for p in glob.glob(os.path.join(step_dir, "**"), recursive=True)
           if os.path.isfile(p) and
           os.path.basename(p) != integrity.MANIFEST_FILENAME]
  return max(files, key=os.path.getsize)


class _MarksWhenUnpickled:
  """Creates `path` if it is ever unpickled."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (open, (self.path, "w"))


class CheckpointerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.dir = os.path.join(self.root, "checkpoints")

  def _checkpointer(self, directory=None, **kwargs):
    options = dict(max_to_keep=2, async_save=True)
    options.update(kwargs)
    ckpt = manager.Checkpointer(directory or self.dir, **options)
    self.addCleanup(ckpt.close)
    return ckpt

  def test_round_trip_is_exact_and_keeps_the_newest(self):
    ckpt = self._checkpointer()
    self.assertIsNone(ckpt.latest_step())
    states = {step: _state(step) for step in (2, 4, 6)}
    for step, state in states.items():
      ckpt.save(step, state, {"next_step": step})
    ckpt.save(6, states[6], {"next_step": 6})  # Already saved: no-op.
    ckpt.wait()
    self.assertEqual(ckpt.all_steps(), [4, 6])
    restored, data = ckpt.restore(_abstract(states[6]))
    self.assertEqual(data, {"next_step": 6})
    self.assertEqual(jax.tree.structure(restored),
                     jax.tree.structure(states[6]))
    jax.tree.map(lambda a, b: self.assertEqual(a.dtype, b.dtype), restored,
                 states[6])
    jax.tree.map(np.testing.assert_array_equal, restored, states[6])
    restored4, _ = ckpt.restore(_abstract(states[4]), step=4)
    jax.tree.map(np.testing.assert_array_equal, restored4, states[4])

  def test_async_save_copies_before_returning(self):
    # The train step donates the state right after a save: the save must not
    # read the device buffers later.
    ckpt = self._checkpointer()
    state = _state(1)
    expected = jax.tree.map(np.asarray, state)
    ckpt.save(1, state, {"next_step": 1})
    for leaf in jax.tree.leaves(state):
      leaf.delete()
    ckpt.wait()
    restored, _ = ckpt.restore(_abstract(_state(1)), step=1)
    jax.tree.map(np.testing.assert_array_equal, restored, expected)

  def test_manifest_is_written_before_the_step_becomes_visible(self):
    ckpt = self._checkpointer()
    final = ckpt.step_path(3)
    seen = []
    original = integrity.write_manifest

    def write_manifest(tmp_dir):
      seen.append((tmp_dir, os.path.exists(final)))
      return original(tmp_dir)

    with mock.patch.object(integrity, "write_manifest", write_manifest):
      ckpt.save(3, _state(3), {"next_step": 3})
      ckpt.wait()
    self.assertEqual(seen, [(final + manager.ORBAX_TMP_SUFFIX, False)])
    self.assertTrue(os.path.isfile(
        os.path.join(final, integrity.MANIFEST_FILENAME)))
    self.assertEqual(ckpt.check(3), [])

  def test_blocking_save_is_durable_on_return(self):
    ckpt = self._checkpointer(async_save=False)
    ckpt.save(1, _state(1), {"next_step": 1})
    self.assertEqual(os.listdir(self.dir), ["1"])
    self.assertEqual(ckpt.check(1), [])

  def test_missing_checkpoint_names_the_path(self):
    ckpt = self._checkpointer()
    with self.assertRaisesRegex(manager.CheckpointError, self.dir):
      ckpt.restore(_abstract(_state(0)))
    self.assertIsNone(tiers.restore_newest([ckpt], _abstract(_state(0))))
    ckpt.save(2, _state(2), {"next_step": 2})
    ckpt.wait()
    with self.assertRaisesRegex(manager.CheckpointError,
                                os.path.join(self.dir, "7") + ".*exist"):
      ckpt.restore(_abstract(_state(0)), step=7)

  def test_other_model_is_named_and_not_a_fallback(self):
    ckpt = self._checkpointer()
    ckpt.save(1, _state(1), {"next_step": 1})
    ckpt.save(2, _state(2), {"next_step": 2})
    ckpt.wait()
    other = _state(1)
    other["params"]["layer"]["kernel"] = jnp.zeros((5, 3))
    with self.assertRaisesRegex(
        manager.CheckpointMismatchError,
        os.path.join(self.dir, "2") + " was saved from a different model.*"
        r"params/layer/kernel: \(4, 3\) in the checkpoint, \(5, 3\) in the"
        " model"):
      tiers.restore_newest([ckpt], _abstract(other))
    del other["params"]["layer"]["scale"]
    with self.assertRaisesRegex(manager.CheckpointMismatchError,
                                "params/layer/scale: not in the model"):
      ckpt.restore(_abstract(other), step=1)
    self.assertEqual(ckpt.all_steps(), [1, 2])  # Nothing moved.

  def test_invalid_config(self):
    values = dict(every_steps=2, max_to_keep=2, async_save=True)
    with self.assertRaisesRegex(ValueError, "checkpoint.max_to_keep=0"):
      CheckpointConfig(**{**values, "max_to_keep": 0})
    with self.assertRaisesRegex(ValueError,
                                "checkpoint.local_every_steps=0 must be >= 1"
                                " with checkpoint.local_dir='local'"):
      CheckpointConfig(**values, local_dir="local")
    with self.assertRaisesRegex(ValueError, "needs checkpoint.local_dir"):
      CheckpointConfig(**values, local_every_steps=2)
    with self.assertRaisesRegex(ValueError, "every_minutes=-1"):
      CheckpointConfig(**values, every_minutes=-1)


class TiersAndCorruptionTest(absltest.TestCase):
  """`restore_newest` over a local and a persistent tier."""

  def setUp(self):
    super().setUp()
    root = self.create_tempdir().full_path
    self.local = manager.Checkpointer(os.path.join(root, "local"),
                                      max_to_keep=2, async_save=True,
                                      tier="local")
    self.persistent = manager.Checkpointer(os.path.join(root, "persistent"),
                                           max_to_keep=2, async_save=True)
    self.addCleanup(self.local.close)
    self.addCleanup(self.persistent.close)
    self.states = {step: _state(step) for step in range(1, 8)}
    for ckpt, steps in ((self.local, (2, 4, 6)), (self.persistent, (3, 5))):
      for step in steps:
        ckpt.save(step, self.states[step], {"next_step": step})
      ckpt.wait()
    self.assertEqual(self.local.all_steps(), [4, 6])
    self.assertEqual(self.persistent.all_steps(), [3, 5])
    self.abstract = _abstract(self.states[1])

  def _restore(self):
    return tiers.restore_newest([self.local, self.persistent],
                                  self.abstract)

  def _assert_restored(self, restored, step, tier):
    self.assertEqual((restored.step, restored.tier, restored.data_state),
                     (step, tier, {"next_step": step}))
    jax.tree.map(np.testing.assert_array_equal, restored.state,
                 self.states[step])

  def test_newest_step_of_any_tier(self):
    self._assert_restored(self._restore(), 6, "local")
    shutil.rmtree(self.local.directory)  # The machine's local disk is gone.
    self.local.reload()
    self._assert_restored(self._restore(), 5, "persistent")

  def test_tie_prefers_the_faster_tier(self):
    self.persistent.save(6, self.states[6], {"next_step": 6})
    self.persistent.wait()
    self._assert_restored(self._restore(), 6, "local")

  def test_flipped_byte_falls_back_naming_step_and_path(self):
    step6 = self.local.step_path(6)
    bad_file = _largest_file(step6)
    _flip_byte(bad_file, offset=os.path.getsize(bad_file) // 2)
    with self.assertLogs(level="WARNING") as logs:
      restored = self._restore()
    self._assert_restored(restored, 5, "persistent")
    log = "\n".join(logs.output)
    self.assertIn(f"Checkpoint of step 6 ({step6}) is corrupt: "
                  f"{os.path.relpath(bad_file, step6)}: SHA-256 differs", log)
    # Moved aside, so that the resumed run can save step 6 again.
    self.assertEqual(self.local.all_steps(), [4])
    [moved] = glob.glob(step6 + manager.CORRUPT_MARK + "*")
    self.assertIn(f"Moved the unusable checkpoint of step 6 to {moved}", log)
    self.local.save(6, self.states[6], {"next_step": 6})
    self.local.wait()
    self._assert_restored(self._restore(), 6, "local")

  def test_missing_file_and_partial_write_fall_back_further(self):
    os.remove(_largest_file(self.local.step_path(6)))
    with open(_largest_file(self.persistent.step_path(5)), "r+b") as f:
      f.truncate(10)
    self._assert_restored(self._restore(), 4, "local")
    self.assertEqual(self.local.all_steps(), [4])
    self.assertEqual(self.persistent.all_steps(), [3])

  def test_no_usable_checkpoint_names_each_and_moves_nothing(self):
    for ckpt in (self.local, self.persistent):
      for step in ckpt.all_steps():
        os.remove(os.path.join(ckpt.step_path(step),
                               integrity.MANIFEST_FILENAME))
    with self.assertRaises(manager.CheckpointError) as raised:
      self._restore()
    message = str(raised.exception)
    for step, ckpt in ((6, self.local), (5, self.persistent),
                       (4, self.local), (3, self.persistent)):
      self.assertIn(f"step {step} ({ckpt.step_path(step)}):"
                    f" {integrity.MANIFEST_FILENAME} is missing", message)
    self.assertEqual(self.local.all_steps(), [4, 6])
    self.assertEqual(self.persistent.all_steps(), [3, 5])

  def test_tampered_file_is_never_unpickled(self):
    marker = os.path.join(self.create_tempdir().full_path, "unpickled")
    data_file = os.path.join(self.local.step_path(6), manager.DATA_ITEM,
                             "metadata")
    self.assertTrue(os.path.isfile(data_file))
    with open(data_file, "wb") as f:
      pickle.dump(_MarksWhenUnpickled(marker), f)
    # The manifest check rejects the file before anything reads it.
    self._assert_restored(self._restore(), 5, "persistent")
    # Read directly (no manifest check), it is refused as bad JSON.
    bad = manager.Checkpointer(self.local.directory, max_to_keep=2,
                               async_save=True)
    self.addCleanup(bad.close)
    [moved] = glob.glob(self.local.step_path(6) + manager.CORRUPT_MARK + "*")
    os.rename(moved, self.local.step_path(6))
    bad.reload()
    with self.assertRaisesRegex(manager.CheckpointError,
                                self.local.step_path(6)):
      bad.restore(self.abstract, step=6)
    self.assertFalse(os.path.exists(marker))


class FailedSaveTest(absltest.TestCase):

  def test_full_disk_in_the_background_names_the_step_and_keeps_the_rest(
      self):
    directory = os.path.join(self.create_tempdir().full_path, "ckpt")
    ckpt = manager.Checkpointer(directory, max_to_keep=2, async_save=True)
    ckpt.save(1, _state(1), {"next_step": 1})
    ckpt.wait()

    def disk_full(path):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    with mock.patch.object(integrity, "write_manifest", disk_full):
      ckpt.save(2, _state(2), {"next_step": 2})  # Fails in the background.
      with self.assertRaisesRegex(
          manager.CheckpointError,
          f"Writing the persistent checkpoint {directory}/2 failed: OSError:"
          r" \[Errno 28\] No space left on device.*Earlier checkpoints in"
          rf" {directory} are intact: steps \[1\]"):
        ckpt.save(3, _state(3), {"next_step": 3})
    ckpt.close()
    self.assertEqual(sorted(os.listdir(directory)),
                     ["1", "2" + manager.ORBAX_TMP_SUFFIX])
    # The next run deletes the unfinished folder and resumes from step 1.
    ckpt = manager.Checkpointer(directory, max_to_keep=2, async_save=True)
    restored = tiers.restore_newest([ckpt], _abstract(_state(1)))
    jax.tree.map(np.testing.assert_array_equal, restored.state, _state(1))
    ckpt.save(2, _state(2), {"next_step": 2})
    ckpt.close()
    self.assertEqual(sorted(os.listdir(directory)), ["1", "2"])

  def test_real_full_disk(self):
    """A real 256 KiB tmpfs (in a user namespace) runs out during a save."""
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"],
        capture_output=True, check=False)
    if probe.returncode:
      self.skipTest("needs unprivileged user namespaces (unshare) to mount a"
                    f" small tmpfs: {probe.stderr.decode().strip()}")
    mount = self.create_tempdir().full_path
    script = textwrap.dedent(f"""
        import jax, numpy as np
        from maxtext.checkpoint import manager
        from maxtext.checkpoint import tiers
        ckpt = manager.Checkpointer({mount!r} + "/ckpt", max_to_keep=5,
                                    async_save=True)
        state = {{"w": jax.numpy.asarray(
            np.random.default_rng(0).normal(size=(100, 100)), "float32")}}
        for step in range(1, 20):
          try:
            ckpt.save(step, state, {{"next_step": step}})
            ckpt.wait()
          except manager.CheckpointError as e:
            print("FAILED", e)
            break
        restored = tiers.restore_newest([ckpt], state)
        print("RESTORED", restored.step,
              bool((np.asarray(restored.state["w"]) ==
                    np.asarray(state["w"])).all()))
        """)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))] + sys.path))
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
         f"mount -t tmpfs -o size=256k tmpfs {mount} && exec"
         f" {sys.executable} -c \"$SCRIPT\""],
        env={**env, "SCRIPT": script}, capture_output=True, text=True,
        timeout=120, check=False)
    out = result.stdout
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    self.assertLen(failed, 1, out)
    self.assertRegex(failed[0], r"FAILED Writing the persistent checkpoint"
                     rf" {mount}/ckpt/(\d+) failed: .*No space left on"
                     r" device.*intact: steps \[1, ")
    last_good = int(failed[0].split("intact: steps [")[1].split("]")[0]
                    .split(", ")[-1])
    self.assertIn(f"RESTORED {last_good} True", out)


class DescribeTest(absltest.TestCase):

  def test_a_long_orbax_error_is_cut(self):
    long = ValueError("Item 'state' and args " + "x" * 10000 + " the cause")
    text = manager.describe(long)
    self.assertTrue(text.startswith("ValueError: Item 'state' and args x"))
    self.assertIn(" [...] ", text)
    self.assertTrue(text.endswith("x the cause"))
    self.assertLess(len(text), 1100)
    self.assertEqual(manager.describe(OSError("disk full")),
                     "OSError: disk full")


if __name__ == "__main__":
  absltest.main()
