"""Tests for maxtext.sharding.mesh."""

import dataclasses

from absl.testing import absltest
import jax
import numpy as np

from maxtext.sharding import mesh


@dataclasses.dataclass(frozen=True)
class _FakeDevice:
  """Stands in for a TPU device of a multi-slice job."""

  id: int
  slice_index: int


def _ici(**sizes):
  return mesh.MeshConfig(ici=mesh.AxisSizes(**sizes))


class MeshTest(absltest.TestCase):

  def test_shape_resolution(self):
    self.assertEqual(_ici(data=-1).shape(8), (8, 1, 1, 1, 1, 1, 1))
    self.assertEqual(_ici(data=1, fsdp=2, tensor=2, sequence=-1).shape(8),
                     (1, 2, 1, 2, 2, 1, 1))
    self.assertEqual(_ici(data=4).shape(4), (4, 1, 1, 1, 1, 1, 1))
    with self.assertRaisesRegex(
        ValueError, r"needs 4 devices \(the product of the sizes\), there"
        r" are 2; e.g. set mesh.ici.fsdp=-1"):
      _ici(data=4).shape(2)
    with self.assertRaisesRegex(
        ValueError, "product of the fixed sizes, 3, does not divide the 8"
        " devices"):
      _ici(data=-1, tensor=3).shape(8)

  def test_invalid_sizes_are_rejected(self):
    with self.assertRaisesRegex(ValueError, "mesh.ici.data=0"):
      _ici(data=0)
    with self.assertRaisesRegex(ValueError, "At most one mesh.ici axis"):
      _ici(data=-1, fsdp=-1)
    with self.assertRaisesRegex(ValueError, "'mesh.ici.model'"):
      mesh.MeshConfig(ici={"model": 2})

  def test_stage_axis_is_the_innermost_axis(self):
    self.assertEqual(_ici(data=-1, stage=2).shape(8), (4, 1, 1, 1, 1, 1, 2))
    devices = mesh.device_array(_ici(data=2, fsdp=2, stage=2),
                                list(range(8)))
    # Stage is the last axis: neighbouring devices are neighbouring stages.
    np.testing.assert_array_equal(devices[..., 0].ravel(), [0, 2, 4, 6])
    np.testing.assert_array_equal(devices[..., 1].ravel(), [1, 3, 5, 7])

  def test_multi_slice_needs_slice_index(self):
    config = mesh.MeshConfig(ici=mesh.AxisSizes(fsdp=-1, data=1),
                             dcn=mesh.AxisSizes(data=2))
    with self.assertRaisesRegex(ValueError, "no slice_index"):
      mesh.device_array(config, jax.devices())

  def test_hybrid_mesh_keeps_slices_contiguous(self):
    # 2 slices x 4 devices: dcn data=2, ici fsdp=2 x tensor=2.
    devices = [_FakeDevice(i, i // 4) for i in range(8)]
    config = mesh.MeshConfig(ici=mesh.AxisSizes(data=1, fsdp=2, tensor=2),
                             dcn=mesh.AxisSizes(data=-1))
    self.assertEqual(config.shapes(8, 2),
                     ((1, 2, 1, 1, 2, 1, 1), (2, 1, 1, 1, 1, 1, 1)))
    array = mesh.device_array(config, devices)
    self.assertEqual(array.shape, (2, 2, 1, 1, 2, 1, 1))
    for data_index in range(2):
      slices = {d.slice_index for d in array[data_index].flat}
      self.assertEqual(slices, {data_index})
    # DCN over fsdp: each fsdp half is one slice, tensor stays inside.
    config = mesh.MeshConfig(ici=mesh.AxisSizes(data=1, fsdp=2, tensor=2),
                             dcn=mesh.AxisSizes(fsdp=2))
    array = mesh.device_array(config, devices).reshape(4, 2)
    np.testing.assert_array_equal(
        [[d.slice_index for d in row] for row in array],
        [[0, 0], [0, 0], [1, 1], [1, 1]])
    with self.assertRaisesRegex(ValueError, r"mesh.dcn .* needs 4 devices"):
      mesh.device_array(mesh.MeshConfig(ici=mesh.AxisSizes(data=-1),
                                        dcn=mesh.AxisSizes(data=4)), devices)

  def test_batch_is_split_over_data(self):
    devices = jax.devices()
    the_mesh = mesh.make_mesh(_ici(data=-1))
    self.assertEqual(the_mesh.axis_names, mesh.AXES)
    self.assertEqual(the_mesh.size, len(devices))
    self.assertEqual(set(the_mesh.axis_types), {jax.sharding.AxisType.Auto})
    rows = 2 * len(devices)
    batch = mesh.batch_to_device(
        the_mesh, {"inputs": np.arange(rows * 3).reshape(rows, 3)})
    self.assertEqual(batch["inputs"].shape, (rows, 3))
    self.assertEqual(batch["inputs"].sharding, mesh.batch_sharding(the_mesh))
    np.testing.assert_array_equal(batch["inputs"],
                                  np.arange(rows * 3).reshape(rows, 3))


if __name__ == "__main__":
  absltest.main()
