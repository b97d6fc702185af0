"""Tests for maxtext.checkpoint.manager."""

import os

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.checkpoint import manager


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


def _config(**overrides):
  values = dict(every_steps=2, max_to_keep=2, async_save=True)
  values.update(overrides)
  return manager.CheckpointConfig(**values)


class CheckpointerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = os.path.join(self.create_tempdir().full_path, "checkpoints")

  def test_round_trip_is_exact_and_keeps_the_newest(self):
    ckpt = manager.Checkpointer(self.dir, _config())
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
    ckpt.close()

  def test_async_save_copies_before_returning(self):
    # The train step donates the state right after a save: the save must not
    # read the device buffers later.
    ckpt = manager.Checkpointer(self.dir, _config())
    state = _state(1)
    expected = jax.tree.map(np.asarray, state)
    ckpt.save(1, state, {"next_step": 1})
    for leaf in jax.tree.leaves(state):
      leaf.delete()
    ckpt.wait()
    restored, _ = ckpt.restore(_abstract(_state(1)), step=1)
    jax.tree.map(np.testing.assert_array_equal, restored, expected)
    ckpt.close()

  def test_missing_checkpoint_names_the_path(self):
    ckpt = manager.Checkpointer(self.dir, _config())
    with self.assertRaisesRegex(manager.CheckpointError, self.dir):
      ckpt.restore(_abstract(_state(0)))
    ckpt.save(2, _state(2), {"next_step": 2})
    ckpt.wait()
    with self.assertRaisesRegex(manager.CheckpointError,
                                os.path.join(self.dir, "7") + ".*exist"):
      ckpt.restore(_abstract(_state(0)), step=7)
    ckpt.close()

  def test_corrupt_checkpoint_names_the_path(self):
    ckpt = manager.Checkpointer(self.dir, _config(async_save=False))
    ckpt.save(3, _state(3), {"next_step": 3})
    ckpt.close()
    state_dir = os.path.join(self.dir, "3", manager.STATE_ITEM)
    for root, _, files in os.walk(state_dir):
      for name in files:
        if name not in ("commit_success.txt",):
          with open(os.path.join(root, name), "wb") as f:
            f.write(b"garbage")
    ckpt = manager.Checkpointer(self.dir, _config())
    self.assertEqual(ckpt.latest_step(), 3)
    with self.assertRaisesRegex(manager.CheckpointError,
                                os.path.join(self.dir, "3") + ".*corrupt"):
      ckpt.restore(_abstract(_state(3)))
    ckpt.close()

  def test_different_structure_is_a_clear_error(self):
    ckpt = manager.Checkpointer(self.dir, _config())
    ckpt.save(1, _state(1), {"next_step": 1})
    ckpt.wait()
    other = _state(1)
    other["params"]["layer"]["kernel"] = jnp.zeros((5, 3))
    with self.assertRaisesRegex(manager.CheckpointError, "could not be"):
      ckpt.restore(_abstract(other))
    ckpt.close()

  def test_invalid_config(self):
    with self.assertRaisesRegex(ValueError, "checkpoint.max_to_keep=0"):
      _config(max_to_keep=0)


if __name__ == "__main__":
  absltest.main()
