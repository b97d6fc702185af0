"""The device mesh from the `mesh` config section, and batch placement.

Mesh axes, outermost first (`AXES`):
  data            data parallel (parameters replicated),
  fsdp            fully sharded data parallel (batch and parameters split),
  fsdp_transpose  a second FSDP axis for the other dimension of a kernel,
  sequence        sequence (context) parallel: activations split along length,
  tensor          tensor parallel: heads, MLP and vocab split,
  expert          expert parallel (no MoE layer yet: the default rules use it
                  as one more batch axis),
  stage           pipeline stages (`maxtext.layers.pipeline`); its size must
                  equal `pipeline.stages`.

Each axis has an ICI size (devices within a slice) and a DCN size (slices);
the mesh axis is their product, DCN outermost. `-1` means "the rest", at most
once among the ICI sizes and at most once among the DCN sizes. With a DCN
size > 1 the devices must carry `slice_index` (multi-slice TPU), and the mesh
is a hybrid mesh: each slice holds a contiguous ICI block.

Shapes: B global batch, L sequence length.
"""

import collections
from collections.abc import Mapping, Sequence
import dataclasses
import math
from typing import Any

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

AXES = ("data", "fsdp", "fsdp_transpose", "sequence", "tensor", "expert",
        "stage")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AxisSizes:
  """Devices along each mesh axis at one level (ICI or DCN); -1: the rest."""

  data: int = 1
  fsdp: int = 1
  fsdp_transpose: int = 1
  sequence: int = 1
  tensor: int = 1
  expert: int = 1
  stage: int = 1

  def sizes(self) -> tuple[int, ...]:
    return tuple(getattr(self, name) for name in AXES)


def _axis_sizes(kind: str, values: Any) -> AxisSizes:
  if isinstance(values, AxisSizes):
    return values
  if hasattr(values, "to_dict"):
    values = values.to_dict()
  unknown = sorted(set(values) - set(AXES))
  if unknown:
    keys = ", ".join(f"'mesh.{kind}.{key}'" for key in unknown)
    raise ValueError(f"Unknown config key {keys}; valid mesh axes: {AXES}.")
  return AxisSizes(**values)


def _resolve(kind: str, sizes: Sequence[int], total: int) -> tuple[int, ...]:
  """`sizes` with -1 filled so that the product is `total`."""
  sizes = list(sizes)
  known = math.prod(s for s in sizes if s != -1)
  named = dict(zip(AXES, sizes))
  if -1 in sizes:
    if total % known:
      raise ValueError(
          f"mesh.{kind} {named}: the product of the fixed sizes, {known},"
          f" does not divide the {total} devices{_suggest(kind, total)}.")
    sizes[sizes.index(-1)] = total // known
  elif known != total:
    raise ValueError(
        f"mesh.{kind} {named} needs {known} devices (the product of the"
        f" sizes), there are {total}{_suggest(kind, total)}.")
  return tuple(sizes)


def _suggest(kind: str, total: int) -> str:
  return (f"; e.g. set mesh.{kind}.fsdp=-1 (and the other {kind} sizes to"
          f" divisors of {total})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
  """The `mesh` config section.

  Attributes:
    ici: Devices per axis within a slice (`AxisSizes` or a mapping).
    dcn: Slices per axis (`AxisSizes` or a mapping); all 1 on one slice.
  """

  ici: AxisSizes = AxisSizes(data=-1)
  dcn: AxisSizes = AxisSizes()

  def __post_init__(self):
    for kind in ("ici", "dcn"):
      sizes = _axis_sizes(kind, getattr(self, kind))
      object.__setattr__(self, kind, sizes)
      for name, value in zip(AXES, sizes.sizes()):
        if isinstance(value, bool) or not isinstance(value, int) or (
            value != -1 and value < 1):
          raise ValueError(
              f"mesh.{kind}.{name}={value!r} must be a positive number of"
              " devices or -1 (the rest).")
      if sizes.sizes().count(-1) > 1:
        raise ValueError(f"At most one mesh.{kind} axis may be -1.")

  def shapes(self, num_devices: int,
             num_slices: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ICI shape, DCN shape) for `num_devices` in `num_slices` slices.

    Raises:
      ValueError: the sizes do not fit the devices (the message shows the
        product, the device count and a valid setting).
    """
    if num_devices % num_slices:
      raise ValueError(f"{num_devices} devices do not split into"
                       f" {num_slices} equal slices.")
    dcn = _resolve("dcn", self.dcn.sizes(), num_slices)
    ici = _resolve("ici", self.ici.sizes(), num_devices // num_slices)
    return ici, dcn

  def shape(self, num_devices: int, num_slices: int = 1) -> tuple[int, ...]:
    """Mesh axis sizes (ICI x DCN per axis), -1 resolved."""
    ici, dcn = self.shapes(num_devices, num_slices)
    return tuple(i * d for i, d in zip(ici, dcn))


def _slice_mesh(shape: Sequence[int], devices: Sequence[Any]) -> np.ndarray:
  """Devices of one slice arranged in `shape` (topology-aware on TPU)."""
  if devices and getattr(devices[0], "platform", None) == "tpu":
    return mesh_utils.create_device_mesh(shape, devices,
                                         allow_split_physical_axes=True)
  return np.asarray(devices, dtype=object).reshape(shape)


def device_array(config: MeshConfig, devices: Sequence[Any]) -> np.ndarray:
  """Devices arranged in the mesh shape; slices are contiguous ICI blocks.

  Raises:
    ValueError: a DCN size > 1 but the devices have no `slice_index`, or the
      sizes do not fit the devices.
  """
  dcn_product = math.prod(s for s in config.dcn.sizes() if s != -1)
  multi_slice = dcn_product > 1 or (-1 in config.dcn.sizes() and any(
      getattr(d, "slice_index", 0) for d in devices))
  if not multi_slice:
    ici, _ = config.shapes(len(devices), 1)
    return _slice_mesh(ici, devices)
  if not all(hasattr(d, "slice_index") for d in devices):
    raise ValueError(
        f"mesh.dcn {dict(zip(AXES, config.dcn.sizes()))} asks for several"
        " slices, but the devices have no slice_index (not a multi-slice"
        " TPU); set every mesh.dcn size to 1.")
  by_slice = collections.defaultdict(list)
  for device in devices:
    by_slice[device.slice_index].append(device)
  slices = [by_slice[index] for index in sorted(by_slice)]
  if len({len(s) for s in slices}) != 1:
    raise ValueError("Slices have different numbers of devices: "
                     f"{[len(s) for s in slices]}.")
  ici, dcn = config.shapes(len(devices), len(slices))
  blocks = np.stack([_slice_mesh(ici, s) for s in slices])
  blocks = blocks.reshape(*dcn, *ici)
  # Axes (dcn_0..dcn_n, ici_0..ici_n) -> (dcn_0, ici_0, dcn_1, ici_1, ...).
  n = len(AXES)
  order = [k for i in range(n) for k in (i, n + i)]
  return blocks.transpose(order).reshape(
      tuple(i * d for i, d in zip(ici, dcn)))


def make_mesh(config: MeshConfig,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over `devices` (default: all) with axes `AXES` (Auto axis types).

  Raises:
    ValueError: the sizes do not fit the devices (see `MeshConfig.shapes`).
  """
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(device_array(config, devices), AXES,
              axis_types=(AxisType.Auto,) * len(AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  """Sharding of a value copied on every device."""
  return NamedSharding(mesh, PartitionSpec())


# Batch axes when no rule table is given: every axis that splits the batch by
# default.
BATCH_AXES = ("data", "fsdp", "fsdp_transpose", "expert")


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a [B, L] batch without rules: B split over `BATCH_AXES`."""
  return NamedSharding(mesh, PartitionSpec(
      tuple(a for a in BATCH_AXES if mesh.shape[a] > 1) or None))


def batch_to_device(mesh: Mesh, local_batch: Mapping[str, np.ndarray],
                    sharding: NamedSharding | None = None
                    ) -> dict[str, jax.Array]:
  """Global arrays from this process's rows of a batch."""
  sharding = batch_sharding(mesh) if sharding is None else sharding
  return {key: jax.make_array_from_process_local_data(sharding, value)
          for key, value in local_batch.items()}
