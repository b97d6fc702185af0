"""The training state: parameters, optimizer state and step, as one pytree.

Parameters are kept as a plain nested dict of arrays (`nnx.State` converted
with `nnx.to_pure_dict`), which optax, Orbax and `jax.tree` handle directly; the
model is rebuilt inside the jitted step with `nnx.merge(graphdef, params)`.
The graph definition, the optimizer and the loss options are static fields:
they are part of the jit cache key, not of the checkpoint.
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
  """

  step: jax.Array
  params: Any
  opt_state: optax.OptState
  model_state: Any
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  tx: optax.GradientTransformation = struct.field(pytree_node=False)
  schedule: optax.Schedule = struct.field(pytree_node=False)
  z_loss: float = struct.field(pytree_node=False)

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


def create_train_state(model_config: ModelConfig, *, seed: int,
                       tx: optax.GradientTransformation,
                       schedule: optax.Schedule, z_loss: float,
                       mesh: jax.sharding.Mesh,
                       abstract: bool = False) -> TrainState:
  """A freshly initialised state, created on the mesh (replicated).

  Args:
    model_config: The model.
    seed: Seed of the parameter initialisation.
    tx: The optimizer.
    schedule: Its learning-rate schedule (reported as a metric).
    z_loss: Weight of the z-loss.
    mesh: Devices; the state is created directly with its sharding.
    abstract: Return `jax.ShapeDtypeStruct` leaves (with shardings) instead of
      arrays, without allocating or computing anything: the target of a
      checkpoint restore.

  Returns:
    The state at step 0.
  """
  graphdef, _, _ = _split(nnx.eval_shape(
      lambda: registry.create_model(model_config, rngs=nnx.Rngs(seed))))

  def init() -> dict[str, Any]:
    model = registry.create_model(model_config, rngs=nnx.Rngs(seed))
    _, params, model_state = _split(model)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": tx.init(params), "model_state": model_state}

  sharding = mesh_lib.replicated(mesh)
  if abstract:
    shapes = jax.eval_shape(init)
    tree = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        shapes)
  else:
    tree = jax.jit(init, out_shardings=sharding)()
  return TrainState(graphdef=graphdef, tx=tx, schedule=schedule,
                    z_loss=z_loss, **tree)
