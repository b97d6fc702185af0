"""The training state: parameters, optimizer state and step, as one pytree.

Parameters are kept as a plain nested dict of arrays (`nnx.State` converted
with `nnx.to_pure_dict`), which optax, Orbax and `jax.tree` handle directly; the
model is rebuilt inside the jitted step with `nnx.merge(graphdef, params)`.
The graph definition, the optimizer, the loss options, the sharding rules
and the number of microbatches are static fields: they are part of the jit
cache key, not of the checkpoint.

With sharding rules, every array is created already in its final layout: the
initialiser runs under jit with `out_shardings` derived from the parameters'
logical axis names and the parameter rules (the optimizer state mirrors the
parameters), so no device or host ever holds a full unsharded copy.
"""

from typing import Any

from flax import nnx
from flax import struct
import jax
import jax.numpy as jnp
import optax

from maxtext.common.model_config import ModelConfig
from maxtext.models import registry
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib


@struct.dataclass
class TrainState:
  """Everything one update reads and writes.

  Attributes:
    step: Number of updates applied so far (int32 scalar).
    params: Trainable parameters (nested dict of arrays).
    opt_state: Optimizer state.
    model_state: Non-trainable model variables (usually empty).
    graphdef: Static structure of the model.
    tx: The optimizer.
    schedule: Learning rate as a function of step (for metrics).
    z_loss: Weight of the z-loss term.
    rules: Parameter and compute layouts on the mesh; None: parameters
      replicated, activations unconstrained.
    microbatches: The train step accumulates gradients over this many
      slices of the batch.
  """

  step: jax.Array
  params: Any
  opt_state: optax.OptState
  model_state: Any
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  tx: optax.GradientTransformation = struct.field(pytree_node=False)
  schedule: optax.Schedule = struct.field(pytree_node=False)
  z_loss: float = struct.field(pytree_node=False)
  rules: rules_lib.LogicalRules | None = struct.field(pytree_node=False,
                                                      default=None)
  microbatches: int = struct.field(pytree_node=False, default=1)

  def model(self) -> nnx.Module:
    """The model with this state's parameters."""
    return nnx.merge(self.graphdef, self.params, self.model_state)

  def checkpoint_tree(self) -> dict[str, Any]:
    """The arrays saved in a checkpoint."""
    return {"step": self.step, "params": self.params,
            "opt_state": self.opt_state, "model_state": self.model_state}

  def replace_checkpoint_tree(self, tree: dict[str, Any]) -> "TrainState":
    """This state with the arrays of a restored `checkpoint_tree`."""
    return self.replace(**tree)


def _split(model: nnx.Module):
  graphdef, params, model_state = nnx.split(model, nnx.Param, ...)
  return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)


def state_shardings(abstract_tree: dict[str, Any], param_names: Any,
                    tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                    rules: rules_lib.LogicalRules | None) -> dict[str, Any]:
  """Shardings of a `checkpoint_tree` (shapes in `abstract_tree`).

  Parameters follow `rules.param_rules` by their logical axis names
  (`param_names`, a tree of name tuples); the optimizer state's
  parameter-shaped leaves follow their parameter; everything else is
  replicated.
  """
  replicated = mesh_lib.replicated(mesh)
  if rules is None:
    return jax.tree.map(lambda _: replicated, abstract_tree)

  def param_sharding(names, leaf):
    if len(names) != leaf.ndim:  # A parameter without logical names.
      return replicated
    return rules.param_sharding(names, leaf.shape)

  params = jax.tree.map(param_sharding, param_names, abstract_tree["params"],
                        is_leaf=lambda x: isinstance(x, tuple))
  opt_state = optax.tree_map_params(
      tx, lambda _, sharding: sharding, abstract_tree["opt_state"], params,
      transform_non_params=lambda _: replicated)
  return {"step": replicated, "params": params, "opt_state": opt_state,
          "model_state": jax.tree.map(lambda _: replicated,
                                      abstract_tree["model_state"])}


def create_train_state(model_config: ModelConfig, *, seed: int,
                       tx: optax.GradientTransformation,
                       schedule: optax.Schedule, z_loss: float,
                       mesh: jax.sharding.Mesh,
                       rules: rules_lib.LogicalRules | None = None,
                       microbatches: int = 1,
                       abstract: bool = False) -> TrainState:
  """A freshly initialised state, created on the mesh in its final layout.

  Args:
    model_config: The model.
    seed: Seed of the parameter initialisation.
    tx: The optimizer.
    schedule: Its learning-rate schedule (reported as a metric).
    z_loss: Weight of the z-loss.
    mesh: Devices; the state is created directly with its sharding.
    rules: Parameter and compute layouts; None replicates the state.
    microbatches: Gradient-accumulation steps of the train step.
    abstract: Return `jax.ShapeDtypeStruct` leaves (with shardings) instead of
      arrays, without allocating or computing anything: the target of a
      checkpoint restore.

  Returns:
    The state at step 0.
  """
  abstract_model = nnx.eval_shape(
      lambda: registry.create_model(model_config, rngs=nnx.Rngs(seed)))
  graphdef, abstract_params, _ = nnx.split(abstract_model, nnx.Param, ...)
  param_names = rules_lib.logical_names(abstract_params)

  def init() -> dict[str, Any]:
    model = registry.create_model(model_config, rngs=nnx.Rngs(seed))
    _, params, model_state = _split(model)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": tx.init(params), "model_state": model_state}

  shapes = jax.eval_shape(init)
  shardings = state_shardings(shapes, param_names, tx, mesh, rules)
  if abstract:
    tree = jax.tree.map(
        lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                 sharding=sharding),
        shapes, shardings)
  else:
    tree = jax.jit(init, out_shardings=shardings)()
  return TrainState(graphdef=graphdef, tx=tx, schedule=schedule,
                    z_loss=z_loss, rules=rules, microbatches=microbatches,
                    **tree)
