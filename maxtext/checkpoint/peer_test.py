"""Tests the peer tier's pieces in one process (8 CPU devices): the copy of
one replica's state to the others, bit for bit, and the checks of the mesh.

Two processes end to end: maxtext/bin/peer_tier_test.py.
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.checkpoint import peer
from maxtext.sharding import mesh as mesh_lib

P = jax.sharding.PartitionSpec


def _mesh(data: int) -> jax.sharding.Mesh:
  return mesh_lib.make_mesh(mesh_lib.MeshConfig(
      ici=mesh_lib.AxisSizes(data=data, fsdp=-1)))


class CopyToAllTest(absltest.TestCase):

  def _checkpointer(self, mesh) -> peer.PeerCheckpointer:
    checkpointer = peer.PeerCheckpointer(
        self.create_tempdir().full_path, mesh, max_to_keep=1,
        async_save=False)
    self.addCleanup(checkpointer.close)
    return checkpointer

  def test_one_replicas_arrays_reach_every_device_bit_for_bit(self):
    mesh = _mesh(2)
    checkpointer = self._checkpointer(mesh)
    values = [np.array([-0.0, np.nan, -np.inf, 1.5, 2, 3, 4, 5], np.float32),
              np.array([-0.0, 1.0, 2.0, 3.0], jnp.bfloat16),
              np.array([[True, False], [False, True], [True, True],
                        [False, False]]),
              np.array(-7, np.int32)]
    specs = [P("fsdp"), P("fsdp"), P("fsdp", None), P()]
    leaves = [jax.ShapeDtypeStruct(v.shape, v.dtype,
                                   sharding=jax.sharding.NamedSharding(mesh, s))
              for v, s in zip(values, specs)]
    for replica in (0, 1):
      sub = jax.sharding.Mesh(mesh.devices[replica:replica + 1],
                              mesh.axis_names)
      restored = [jax.device_put(v, jax.sharding.NamedSharding(sub, s))
                  for v, s in zip(values, specs)]
      copied = checkpointer._copy_to_all(replica, leaves, restored)
      for got, want, leaf in zip(copied, values, leaves):
        self.assertEqual(got.sharding, leaf.sharding)
        self.assertEqual(got.dtype, want.dtype)
        for shard in got.addressable_shards:  # Every device's copy.
          np.testing.assert_array_equal(
              np.asarray(shard.data).reshape(-1).view(np.uint8),
              want[shard.index].reshape(-1).view(np.uint8))

  def test_a_state_split_over_data_is_refused(self):
    mesh = _mesh(2)
    checkpointer = self._checkpointer(mesh)
    leaf = jax.ShapeDtypeStruct((8,), np.float32, sharding=(
        jax.sharding.NamedSharding(mesh, P(("data", "fsdp")))))
    with self.assertRaisesRegex(ValueError, "split over the data axis"):
      checkpointer._copy_to_all(0, [leaf], None)


class MetadataTest(absltest.TestCase):

  def test_the_saved_tree_survives_json(self):
    tree = {"params": {"w": jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)},
            "opt_state": [{"count": jax.ShapeDtypeStruct((), np.int32)},
                          None]}
    got = peer._decode(peer._encode(tree))
    self.assertEqual(jax.tree.structure(got), jax.tree.structure(tree))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(tree)):
      self.assertEqual((a.shape, a.dtype), (b.shape, b.dtype))


class CheckMeshTest(absltest.TestCase):

  def test_one_process_is_refused(self):
    with self.assertRaisesRegex(ValueError, "this run has one process"):
      peer.check_mesh(_mesh(2), zero1=False)

  def test_replicas_are_the_data_rows(self):
    self.assertEqual(peer.replica_processes(_mesh(2)),
                     [frozenset({0}), frozenset({0})])


if __name__ == "__main__":
  absltest.main()
