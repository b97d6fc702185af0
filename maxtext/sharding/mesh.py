"""The device mesh from the `mesh` config section, and batch placement.

Mesh axes, outermost first: "data" (data parallel), "fsdp" (fully sharded
data parallel), "tensor" (tensor parallel). For now parameters are replicated
and the batch is split over "data" and "fsdp"; "fsdp" and "tensor" larger
than 1 need the logical-axis rule table (not written yet) and are rejected.

Shapes: B global batch, L sequence length.
"""

import dataclasses
import math

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
  """The `mesh` config section: devices along each mesh axis.

  Attributes:
    data: Data-parallel ways; -1 means all devices left over by the others.
    fsdp: Fully-sharded data-parallel ways (must be 1 for now).
    tensor: Tensor-parallel ways (must be 1 for now).
  """

  data: int
  fsdp: int
  tensor: int

  def __post_init__(self):
    for name in AXES:
      value = getattr(self, name)
      if value != -1 and value < 1:
        raise ValueError(
            f"mesh.{name}={value!r} must be a positive number of devices or"
            " -1 (the rest).")
    if [getattr(self, name) for name in AXES].count(-1) > 1:
      raise ValueError("At most one mesh axis may be -1.")
    for name in ("fsdp", "tensor"):
      if getattr(self, name) != 1:
        raise ValueError(
            f"mesh.{name}={getattr(self, name)} is not supported yet: parameters"
            " are replicated until the sharding rule table lands; use"
            " mesh.data.")

  def shape(self, num_devices: int) -> tuple[int, ...]:
    """Axis sizes for `num_devices` devices, -1 resolved."""
    sizes = [getattr(self, name) for name in AXES]
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise ValueError(
            f"Mesh {dict(zip(AXES, sizes))} does not divide {num_devices}"
            " devices.")
      sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
      raise ValueError(
          f"Mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices,"
          f" there are {num_devices}.")
    return tuple(sizes)


def make_mesh(config: MeshConfig,
              devices: list[jax.Device] | None = None) -> Mesh:
  """A mesh over `devices` (default: all) with axes `AXES`."""
  devices = jax.devices() if devices is None else devices
  shape = config.shape(len(devices))
  return Mesh(np.asarray(devices).reshape(shape), AXES)


def replicated(mesh: Mesh) -> NamedSharding:
  """Sharding of a value copied on every device."""
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a [B, ...] batch: B split over the batch axes."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def batch_to_device(mesh: Mesh,
                    local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """Global arrays from this process's rows of a batch."""
  sharding = batch_sharding(mesh)
  return {key: jax.make_array_from_process_local_data(sharding, value)
          for key, value in local_batch.items()}
