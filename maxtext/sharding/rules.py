"""Logical axis rules: logical axis names -> mesh axes, as config data.

Two mappings, as in levanter: `param_rules` place parameters (and the
optimizer state, which mirrors them), `compute_rules` constrain activations.
Each is a sequence of `(logical_name, mesh_axes)` pairs; `mesh_axes` is a
mesh axis name, a tuple of them, or () for "replicated". A logical name may
appear several times: for each dimension of an array the first rule of its
name that fits wins. A rule fits when none of its mesh axes is already used
by an earlier dimension of the same array and the product of their sizes
divides the dimension; a name without a fitting rule is replicated. Mesh axes
of size 1 are dropped from the resulting `PartitionSpec`.

The optimizer state mirrors the parameters' layout, with two options:
`zero1` also splits it over the `data` axis (ZeRO stage 1: parameters stay
replicated over `data`, each data-parallel replica keeps and updates only its
slice of the moments, and the updates are all-gathered), and
`offload_optimizer_state` keeps it in host memory ("pinned_host") between
steps, on backends whose devices have such memory.

`ShardingConfig` is the `sharding` config section; `LogicalRules` binds a
rule table to a mesh and is hashable, so it can be a static field of a jitted
train state.
"""

from collections.abc import Sequence
import dataclasses
import math
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from maxtext.common import axes
from maxtext.sharding import mesh as mesh_lib

Rules = tuple[tuple[str, tuple[str, ...]], ...]


def normalize_rules(name: str, rules: Any) -> Rules:
  """Rules as a tuple of (logical name, tuple of mesh axes); validated.

  Raises:
    ValueError: a rule is malformed or names an unknown mesh axis.
  """
  if hasattr(rules, "to_dict"):
    rules = rules.to_dict()
  if isinstance(rules, dict):
    rules = list(rules.items())
  result = []
  for rule in rules:
    if not (isinstance(rule, Sequence) and len(rule) == 2 and
            isinstance(rule[0], str)):
      raise ValueError(f"sharding.{name}: rule {rule!r} is not a pair"
                       " (logical_name, mesh_axes).")
    logical, mesh_axes = rule
    if mesh_axes is None:
      mesh_axes = ()
    elif isinstance(mesh_axes, str):
      mesh_axes = (mesh_axes,)
    mesh_axes = tuple(mesh_axes)
    unknown = [a for a in mesh_axes if a not in mesh_lib.AXES]
    if unknown:
      raise ValueError(f"sharding.{name}: rule for {logical!r} names unknown"
                       f" mesh axes {unknown}; valid: {mesh_lib.AXES}.")
    if len(set(mesh_axes)) != len(mesh_axes):
      raise ValueError(f"sharding.{name}: rule for {logical!r} repeats a"
                       f" mesh axis: {mesh_axes}.")
    result.append((logical, mesh_axes))
  return tuple(result)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardingConfig:
  """The `sharding` config section.

  Attributes:
    param_rules: Parameter layout: (logical name, mesh axes) pairs.
    compute_rules: Activation layout: (logical name, mesh axes) pairs.
    zero1: Also split the optimizer state over the `data` mesh axis.
    offload_optimizer_state: Keep the optimizer state in host memory
      between steps.
  """

  param_rules: Any
  compute_rules: Any
  zero1: bool = False
  offload_optimizer_state: bool = False

  def __post_init__(self):
    for name in ("param_rules", "compute_rules"):
      object.__setattr__(self, name, normalize_rules(name, getattr(self, name)))
    for name in ("zero1", "offload_optimizer_state"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"sharding.{name}={getattr(self, name)!r} must be"
                         " True or False.")


def logical_to_mesh(names: Sequence[str | None], shape: Sequence[int],
                    rules: Rules, mesh_shape: dict[str, int]) -> PartitionSpec:
  """The mesh `PartitionSpec` of an array with logical axis `names`."""
  if len(names) != len(shape):
    raise ValueError(f"Axis names {tuple(names)} do not match shape"
                     f" {tuple(shape)}.")
  used = set()
  spec = []
  for name, dim in zip(names, shape):
    chosen = None
    for logical, mesh_axes in rules:
      if logical != name:
        continue
      live = tuple(a for a in mesh_axes if mesh_shape[a] > 1)
      if used.intersection(live) or dim % math.prod(
          mesh_shape[a] for a in live):
        continue
      chosen = live
      break
    if not chosen:
      spec.append(None)
    else:
      used.update(chosen)
      spec.append(chosen[0] if len(chosen) == 1 else chosen)
  return PartitionSpec(*spec)


def add_mesh_axis(spec: PartitionSpec, shape: Sequence[int], axis: str,
                  mesh_shape: dict[str, int]) -> PartitionSpec:
  """`spec` with `axis` added to the first dimension it still divides.

  Unchanged when `axis` has size 1, is already used, or divides no
  dimension after the axes already there.
  """
  size = mesh_shape[axis]
  entries = list(axes.spec_axes(spec, len(shape)))
  if size == 1 or any(axis in e for e in entries):
    return spec
  for i, (dim, entry) in enumerate(zip(shape, entries)):
    if dim % (math.prod(mesh_shape[a] for a in entry) * size) == 0:
      entries[i] = (axis, *entry)
      return PartitionSpec(*[None if not e else e[0] if len(e) == 1 else e
                             for e in entries])
  return spec


@dataclasses.dataclass(frozen=True)
class LogicalRules:
  """A mesh with its parameter and compute rule tables.

  Raises:
    ValueError: `offload_optimizer_state` on a backend whose devices have no
      "pinned_host" memory (the message names the backend).
  """

  mesh: Mesh
  param_rules: Rules
  compute_rules: Rules
  zero1: bool = False
  offload_optimizer_state: bool = False

  def __post_init__(self):
    if self.offload_optimizer_state:
      device = self.mesh.devices.flat[0]
      kinds = [m.kind for m in device.addressable_memories()]
      if "pinned_host" not in kinds:
        raise ValueError(
            "sharding.offload_optimizer_state=True needs \"pinned_host\""
            f" memory; {device.platform} devices have {kinds}. Set it to"
            " False on this backend.")

  @classmethod
  def from_config(cls, mesh: Mesh, config: ShardingConfig) -> "LogicalRules":
    return cls(mesh, config.param_rules, config.compute_rules,
               zero1=config.zero1,
               offload_optimizer_state=config.offload_optimizer_state)

  def param_spec(self, names: Sequence[str | None],
                 shape: Sequence[int]) -> PartitionSpec:
    return logical_to_mesh(names, shape, self.param_rules,
                           dict(self.mesh.shape))

  def compute_spec(self, names: Sequence[str | None],
                   shape: Sequence[int]) -> PartitionSpec:
    return logical_to_mesh(names, shape, self.compute_rules,
                           dict(self.mesh.shape))

  def param_sharding(self, names, shape) -> NamedSharding:
    return NamedSharding(self.mesh, self.param_spec(names, shape))

  def optimizer_sharding(self, names, shape, *,
                         on_device: bool = False) -> NamedSharding:
    """Sharding of an optimizer-state leaf shaped like parameter `names`.

    Args:
      names: The parameter's logical axis names.
      shape: Its shape.
      on_device: The layout while the update computes (device memory even
        when the state is offloaded between steps).
    """
    spec = self.param_spec(names, shape)
    if self.zero1:
      spec = add_mesh_axis(spec, shape, "data", dict(self.mesh.shape))
    memory_kind = None
    if self.offload_optimizer_state:
      memory_kind = "device" if on_device else "pinned_host"
    return NamedSharding(self.mesh, spec, memory_kind=memory_kind)

  def compute_sharding(self, names, shape) -> NamedSharding:
    return NamedSharding(self.mesh, self.compute_spec(names, shape))

  def batch_sharding(self, shape: Sequence[int]) -> NamedSharding:
    """Sharding of a [B, L] batch of token ids."""
    return self.compute_sharding((axes.BATCH, axes.LENGTH), shape)

  def batch_shards(self) -> int:
    """Ways the batch dimension is split (for divisibility checks)."""
    for logical, mesh_axes in self.compute_rules:
      if logical == axes.BATCH:
        return math.prod(self.mesh.shape[a] for a in mesh_axes)
    return 1

  def constrain(self, x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`x` constrained to the compute layout of logical axes `names`."""
    return jax.lax.with_sharding_constraint(
        x, self.compute_sharding(names, x.shape))


def logical_names(tree: Any) -> Any:
  """Logical axis names of every leaf of an `nnx.State` of parameters.

  Returns:
    The same structure as `nnx.to_pure_dict(tree)`, with a tuple of names per
    leaf (names are None where a parameter carries none).
  """
  specs = nnx.to_pure_dict(nnx.get_partition_spec(tree))
  return jax.tree.map(lambda spec: tuple(spec), specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))
