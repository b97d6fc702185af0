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

With `rules.zero1` (optimizer state also split over `data`) or
`rules.offload_optimizer_state` (kept in host memory), the optimizer is
wrapped so that each update moves the state into device memory in its
layout, updates it there, constrains the updates to the parameters' layout
and moves the state back; the train step itself is unchanged.
"""

from collections.abc import Callable
from typing import Any

from flax import nnx
from flax import struct
import jax
import jax.numpy as jnp
import optax

from maxtext.common.model_config import ModelConfig
from maxtext.layers import mla
from maxtext.models import execution as execution_lib
from maxtext.models import registry
from maxtext.optim import optimizer as optimizer_lib
from maxtext.quant import qat as qat_lib
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
    trainable: Which parameters train, a predicate of their path names
      (`maxtext.optim.optimizer`); None: all of them.
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
  trainable: Callable[[tuple[str, ...]], bool] | None = struct.field(
      pytree_node=False, default=None)

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


def all_finite(tree: Any) -> jax.Array:
  """Whether every floating-point value of `tree` is finite (a bool scalar,
  computed where the arrays are)."""
  checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def split_model(model: nnx.Module):
  """(graphdef, params, model_state) of `model`, the states as pure dicts."""
  graphdef, params, model_state = nnx.split(model, nnx.Param, ...)
  return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)


def _names_or_none(names, leaf):
  """`names`, or None for a parameter without logical names."""
  return names if len(names) == leaf.ndim else None


def state_shardings(abstract_tree: dict[str, Any], param_names: Any,
                    tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                    rules: rules_lib.LogicalRules | None, *,
                    opt_on_device: bool = False) -> dict[str, Any]:
  """Shardings of a `checkpoint_tree` (shapes in `abstract_tree`).

  Parameters follow `rules.param_rules` by their logical axis names
  (`param_names`, a tree of name tuples); the optimizer state's
  parameter-shaped leaves follow `rules.optimizer_sharding` (their
  parameter's layout, split over `data` with ZeRO-1, in host memory when
  offloaded unless `opt_on_device`); everything else is replicated.
  """
  replicated = mesh_lib.replicated(mesh)
  if rules is None:
    return jax.tree.map(lambda _: replicated, abstract_tree)
  is_names = lambda x: isinstance(x, tuple)  # pylint: disable=g-long-lambda

  def param_sharding(names, leaf):
    names = _names_or_none(names, leaf)
    return replicated if names is None else rules.param_sharding(
        names, leaf.shape)

  def optimizer_sharding(names, leaf):
    names = _names_or_none(names, leaf) or (None,) * leaf.ndim
    return rules.optimizer_sharding(names, leaf.shape,
                                    on_device=opt_on_device)

  params = jax.tree.map(param_sharding, param_names, abstract_tree["params"],
                        is_leaf=is_names)
  param_like = jax.tree.map(optimizer_sharding, param_names,
                            abstract_tree["params"], is_leaf=is_names)
  opt_state = optax.tree_map_params(
      tx, lambda _, sharding: sharding, abstract_tree["opt_state"],
      param_like, transform_non_params=lambda _: replicated)
  return {"step": replicated, "params": params, "opt_state": opt_state,
          "model_state": jax.tree.map(lambda _: replicated,
                                      abstract_tree["model_state"])}


def _placed_optimizer(tx: optax.GradientTransformation, param_shardings: Any,
                      opt_shardings: Any, device_opt_shardings: Any
                      ) -> optax.GradientTransformation:
  """`tx` whose update runs on the optimizer state in its device layout.

  The state is moved to `device_opt_shardings` (from host memory when
  offloaded), updated, and moved back to `opt_shardings`; the updates are
  constrained to `param_shardings` (with ZeRO-1: gathered over `data`).
  """

  inner = optax.with_extra_args_support(tx)

  def update(updates, state, params=None, **extra_args):
    updates, state = inner.update(
        updates, jax.device_put(state, device_opt_shardings), params,
        **extra_args)
    return (jax.lax.with_sharding_constraint(updates, param_shardings),
            jax.device_put(state, opt_shardings))

  return optax.GradientTransformationExtraArgs(tx.init, update)


def create_train_state(model_config: ModelConfig, *,
                       execution: execution_lib.Execution = (
                           execution_lib.Execution()),
                       seed: int,
                       tx: optax.GradientTransformation,
                       schedule: optax.Schedule, z_loss: float,
                       mesh: jax.sharding.Mesh,
                       rules: rules_lib.LogicalRules | None = None,
                       microbatches: int = 1,
                       qat: qat_lib.QatConfig | None = None,
                       tokens_shape: tuple[int, int] | None = None,
                       abstract: bool = False) -> TrainState:
  """A freshly initialised state, created on the mesh in its final layout.

  Args:
    model_config: The model.
    execution: How it runs (attention kernel, pipeline, remat).
    seed: Seed of the parameter initialisation.
    tx: The optimizer. With DeepSeek Sparse Attention it is followed by
      `optimizer.keep_frozen` of the parameters the model trains
      (`mla.trainable_params`; all but the indexer's are frozen in the
      dense warm-up), in both stages, so their states match.
    schedule: Its learning-rate schedule (reported as a metric).
    z_loss: Weight of the z-loss.
    mesh: Devices; the state is created directly with its sharding.
    rules: Parameter and compute layouts; None replicates the state.
    microbatches: Gradient-accumulation steps of the train step.
    qat: Quantization-aware training; when on, the graph definition is that
      of the qwix-quantized model (the parameters are the same).
    tokens_shape: [B, L] of the tokens one model call of the train step
      sees; QAT traces the model on tokens of this shape to find its
      matmuls. Needed when `qat` is on.
    abstract: Return `jax.ShapeDtypeStruct` leaves (with shardings) instead of
      arrays, without allocating or computing anything: the target of a
      checkpoint restore.

  Returns:
    The state at step 0.

  Raises:
    ValueError: the mesh's `stage` axis differs from
      `execution.pipeline.stages`, or `qat` is on without `tokens_shape` or
      matches no matmul.
  """
  stages = execution.pipeline.stages
  if mesh.shape["stage"] != stages:
    raise ValueError(
        f"pipeline.stages={stages} must equal the size of the 'stage' mesh"
        f" axis, {mesh.shape['stage']} (set mesh.ici.stage / mesh.dcn.stage"
        " and pipeline.stages together).")
  quantize = qat is not None and qat.enabled
  if quantize and tokens_shape is None:
    raise ValueError(f"qat.qtype={qat.qtype!r} needs the tokens_shape of the"
                     " train step's model calls.")

  def create_model() -> nnx.Module:
    model = registry.create_model(model_config, rngs=nnx.Rngs(seed),
                                  execution=execution)
    if quantize:
      model = qat_lib.quantize_for_training(
          model, qat, jnp.zeros(tokens_shape, jnp.int32))
    return model

  trainable = mla.trainable_params(model_config.mla)
  if model_config.mla.index_topk:
    tx = optax.chain(tx, optimizer_lib.keep_frozen(trainable))
  abstract_model = nnx.eval_shape(create_model)
  graphdef, abstract_params, _ = nnx.split(abstract_model, nnx.Param, ...)
  param_names = rules_lib.logical_names(abstract_params)

  def init() -> dict[str, Any]:
    model = registry.create_model(model_config, rngs=nnx.Rngs(seed),
                                  execution=execution)
    _, params, model_state = split_model(model)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": tx.init(params), "model_state": model_state}

  shapes = jax.eval_shape(init)
  shardings = state_shardings(shapes, param_names, tx, mesh, rules)
  if rules is not None and (rules.zero1 or rules.offload_optimizer_state):
    tx = _placed_optimizer(
        tx, shardings["params"], shardings["opt_state"],
        state_shardings(shapes, param_names, tx, mesh, rules,
                        opt_on_device=True)["opt_state"])
  if abstract:
    tree = jax.tree.map(
        lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                 sharding=sharding),
        shapes, shardings)
  else:
    tree = jax.jit(init, out_shardings=shardings)()
  return TrainState(graphdef=graphdef, tx=tx, schedule=schedule,
                    z_loss=z_loss, rules=rules, microbatches=microbatches,
                    trainable=trainable, **tree)
