"""Tests for maxtext.sharding.mesh."""

from absl.testing import absltest
import jax
import numpy as np

from maxtext.sharding import mesh


class MeshTest(absltest.TestCase):

  def test_shape_resolution(self):
    config = mesh.MeshConfig(data=-1, fsdp=1, tensor=1)
    self.assertEqual(config.shape(8), (8, 1, 1))
    self.assertEqual(mesh.MeshConfig(data=4, fsdp=1, tensor=1).shape(4),
                     (4, 1, 1))
    with self.assertRaisesRegex(ValueError, "needs 4 devices, there are 2"):
      mesh.MeshConfig(data=4, fsdp=1, tensor=1).shape(2)

  def test_unsupported_axes_are_rejected(self):
    with self.assertRaisesRegex(ValueError, "mesh.tensor=2 is not supported"):
      mesh.MeshConfig(data=-1, fsdp=1, tensor=2)
    with self.assertRaisesRegex(ValueError, "mesh.data=0"):
      mesh.MeshConfig(data=0, fsdp=1, tensor=1)

  def test_batch_is_split_over_data(self):
    devices = jax.devices()
    the_mesh = mesh.make_mesh(mesh.MeshConfig(data=-1, fsdp=1, tensor=1))
    self.assertEqual(the_mesh.axis_names, mesh.AXES)
    self.assertEqual(the_mesh.size, len(devices))
    rows = 2 * len(devices)
    batch = mesh.batch_to_device(
        the_mesh, {"inputs": np.arange(rows * 3).reshape(rows, 3)})
    self.assertEqual(batch["inputs"].shape, (rows, 3))
    self.assertEqual(batch["inputs"].sharding, mesh.batch_sharding(the_mesh))
    np.testing.assert_array_equal(batch["inputs"],
                                  np.arange(rows * 3).reshape(rows, 3))


if __name__ == "__main__":
  absltest.main()
