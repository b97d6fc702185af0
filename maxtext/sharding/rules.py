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
  """

  param_rules: Any
  compute_rules: Any

  def __post_init__(self):
    for name in ("param_rules", "compute_rules"):
      object.__setattr__(self, name, normalize_rules(name, getattr(self, name)))


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


@dataclasses.dataclass(frozen=True)
class LogicalRules:
  """A mesh with its parameter and compute rule tables."""

  mesh: Mesh
  param_rules: Rules
  compute_rules: Rules

  @classmethod
  def from_config(cls, mesh: Mesh, config: ShardingConfig) -> "LogicalRules":
    return cls(mesh, config.param_rules, config.compute_rules)

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
