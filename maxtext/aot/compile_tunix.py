"""Compiles a post-training trainer's train step for a target, without
weights.

What the post-training steps share (`compile_sft`: the sft trainer's step
with `sft_loss`; `compile_preference`: DPO/ORPO; `compile_distill`: the
student's; `compile_grpo`: the GRPO actor trainer's step):
`compile_tunix_step` builds the model of a `ModelConfig` as
`base_model.load_model` builds it (unscanned, LoRA/QLoRA adapters as `lora`
asks, parameter metadata in mesh axes, wrapped in a `TunixModel` class) and
its `nnx.Optimizer` (the run's optimizer, `optax.MultiSteps` with
`train.microbatches`, over the adapters only under LoRA), all as abstract
arrays laid out on the target's mesh by their partition specs (the layout
Tunix gives them). It then lowers and compiles the step the trainers run,
`maxtext.posttrain.step.train_step` with the given loss (our trainers jit
it through `tunix_hooks.run_our_step`), under `nnx.jit` with the optimizer
donated, as Tunix's `PeftTrainer.jit_train_and_eval_step` jits it, on one
abstract batch laid out as Tunix's `shard_input` lays out the trainer's
inputs. `analyse` gives the same memory, FLOPs and collectives report as
the `train` step (`maxtext.aot.compile_step`).
"""

from collections.abc import Callable
import dataclasses
import time
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from maxtext.aot import compile_step
from maxtext.aot import topology as topology_lib
from maxtext.checkpoint import params_checkpoint
from maxtext.common.model_config import ModelConfig
from maxtext.layers import remat
from maxtext.models import execution as execution_lib
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.posttrain import base_model
from maxtext.posttrain import compiled_step
from maxtext.posttrain import lora as lora_lib
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import step as step_lib
from maxtext.sharding import rules as rules_lib


@dataclasses.dataclass(frozen=True)
class CompiledTunixStep:
  """A compiled post-training train step and what it was built from.

  Attributes:
    step: The compiled step, its target and mesh (`inputs` is None).
    nnx_compiled: The `nnx.jit` compiled step: on CPU targets it runs here,
      called as `(model, optimizer, batch)` like the trainer's jitted step
      (updates model and optimizer in place, returns (loss, aux,
      grad_norm)); the model and optimizer must have the graph definition
      of `abstract` (`merge`), the batch the layout of `batch` (`put`).
    abstract: The (model, optimizer) pair it was lowered with.
    model_cfg: The model as the trainer trains it (unscanned).
    rows: Sequences of one step's batch.
    seq_len: Tokens per sequence.
    batch: The abstract batch it was lowered with (shapes, dtypes and
      shardings).
    image_flops: FLOPs of the step's images in the vision tower (0
      without), which our per-token count leaves out.
  """

  step: compile_step.CompiledStep
  nnx_compiled: object
  abstract: tuple[adapter.TunixModel, nnx.Optimizer]
  model_cfg: ModelConfig
  rows: int
  seq_len: int
  batch: Any
  image_flops: float = 0.0

  def merge(self, state: nnx.State
            ) -> tuple[adapter.TunixModel, nnx.Optimizer]:
    """(model, optimizer) in the graph the step was compiled for, holding
    `state`, that of a real pair (`nnx.state((model, optimizer))`, e.g. a
    Tunix trainer's). Graph definitions hold per-instance objects (the
    attention kernel) that compare by identity, so the real pair's own
    graph does not match the compiled one."""
    return nnx.merge(nnx.graphdef(self.abstract), state)

  def put(self, batch: Any) -> Any:
    """A real `batch` (the structure of `batch`) in the compiled layout."""
    return jax.tree.map(lambda x, like: jax.device_put(x, like.sharding),
                        batch, self.batch)


def checkpoint_model_config(load: str) -> ModelConfig:
  """The model of checkpoint `load` as `base_model.load_model` builds it
  (unscanned); reads the checkpoint's config only (a converted checkpoint
  may be its `model_config.json` alone)."""
  return params_checkpoint.load_model_config(load).replace(scan_layers=False)


def _abstract_model(cfg: ModelConfig, lora: lora_lib.LoraConfig, seed: int,
                    rules: rules_lib.LogicalRules,
                    tx: optax.GradientTransformation,
                    model_cls: type[adapter.TunixModel],
                    execution: execution_lib.Execution,
                    prepare: Callable[[nnx.Module], None] | None
                    ) -> tuple[adapter.TunixModel, nnx.Optimizer]:
  """The model `base_model.load_model` builds for `cfg` and `execution`,
  wrapped in `model_cls` and changed by `prepare` as the trainer changes
  it, and its optimizer (sharing it, as in a trainer), abstract."""

  def build() -> tuple[adapter.TunixModel, nnx.Optimizer]:
    adapted = lora.mode != "full"
    # As in load_model: adapters are created on a first call without remat.
    model = registry.create_model(
        cfg, rngs=nnx.Rngs(seed), execution=dataclasses.replace(
            execution, remat=remat.RematConfig()) if adapted else execution)
    base_model.to_mesh_axes(model, rules)
    if adapted:
      model = lora_lib.apply_lora(model, lora, seed=seed,
                                  example_tokens=jnp.zeros((1, 8), jnp.int32))
      model.execution = execution
    model = model_cls(model, rules)
    if prepare is not None:
      prepare(model)
    return model, nnx.Optimizer(model, tx,
                                wrt=base_model.trainable_filter(model))

  return nnx.eval_shape(build)


def _placed(tree, mesh: jax.sharding.Mesh):
  """`tree` (an abstract nnx object) with each array laid out by its
  partition spec (from the variables' `out_sharding` metadata)."""
  graphdef, state = nnx.split(tree)
  specs = nnx.get_partition_spec(state)
  state = jax.tree.map(
      lambda x, spec: jax.ShapeDtypeStruct(
          x.shape, x.dtype,
          sharding=jax.sharding.NamedSharding(mesh, spec or
                                              jax.sharding.PartitionSpec())),
      state, specs)
  return nnx.merge(graphdef, state)


def compile_tunix_step(
    config: Any, hardware: topology_lib.Hardware,
    runtime: runtime_lib.Runtime, *, model_cfg: ModelConfig,
    model_cls: type[adapter.TunixModel], loss_fn: Callable[..., Any],
    has_aux: bool, gen_model_input_fn: Callable[[Any], dict[str, Any]],
    batch: Any, rows: int, seq_len: int,
    tx: optax.GradientTransformation | None = None,
    image_flops: float = 0.0,
    prepare: Callable[[nnx.Module], None] | None = None
) -> CompiledTunixStep:
  """Lowers and compiles the trainer's train step (see the module
  docstring).

  Args:
    config: The run's typed config (a `PosttrainConfig` or `RlRunConfig`):
      its `lora`, `optimizer` and `train` sections.
    hardware: The target's devices.
    runtime: The trainer's mesh and rules (on `hardware`'s devices).
    model_cfg: The model as the trainer trains it (unscanned).
    model_cls: The `TunixModel` class the trainer's model is.
    loss_fn: The trainer's `loss_fn` (`with_loss_fn`).
    has_aux: Whether `loss_fn` returns (loss, aux).
    gen_model_input_fn: The trainer's `gen_model_input_fn`: the keyword
      arguments of `loss_fn` (after the model) from one batch.
    batch: One batch as the trainer receives it: a tree of
      `jax.ShapeDtypeStruct` (their shardings are Tunix's).
    rows: Sequences of the batch (for our FLOP count).
    seq_len: Tokens per sequence: the trainer's `data_sharding_axis` is
      `runtime.data_axes(train.rows, seq_len)`, as in
      `runtime.training_config`.
    tx: The trainer's optimizer (before accumulation); None:
      `runtime.make_optimizer(config)`.
    image_flops: FLOPs of the batch's images in the vision tower.
    prepare: What the trainer does to its model before making its optimizer
      (distillation wraps the blocks whose outputs it compares).

  Raises:
    compile_step.DoesNotFitError: the TPU compiler ran out of HBM.
  """
  tx = tx or runtime_lib.make_optimizer(config)
  if config.train.microbatches > 1:
    tx = optax.MultiSteps(tx, config.train.microbatches)
  model, optimizer = _placed(
      _abstract_model(model_cfg, config.lora, config.train.seed,
                      runtime.rules, tx, model_cls, config.execution,
                      prepare),
      runtime.mesh)
  batch = compiled_step.tunix_layout(
      batch, runtime.mesh, runtime.data_axes(config.train.rows, seq_len))
  step_fn = nnx.jit(
      step_lib.for_model(model, loss_fn, has_aux=has_aux,
                         gen_model_input_fn=gen_model_input_fn),
      donate_argnames=("optimizer",))
  start = time.perf_counter()
  with runtime.activate():
    lowered = step_fn.lower(model, optimizer, batch)
    compiled = compile_step.compile_lowered(lowered.lowered, hardware)
  nnx_compiled = nnx.transforms.compilation.Compiled(compiled, step_fn)
  step = compile_step.CompiledStep(
      compiled=compiled, hardware=hardware, mesh=runtime.mesh, inputs=None,
      compile_time_s=time.perf_counter() - start)
  return CompiledTunixStep(step=step, nnx_compiled=nnx_compiled,
                           abstract=(model, optimizer), model_cfg=model_cfg,
                           rows=rows, seq_len=seq_len, batch=batch,
                           image_flops=image_flops)


def analyse(tunix_step: CompiledTunixStep) -> compile_step.StepReport:
  """Memory, FLOPs and collectives of the step, per device.

  Our FLOP count is that of full training (LoRA trains fewer weights).
  """
  return compile_step.report(
      tunix_step.step, tunix_step.model_cfg, tunix_step.rows,
      tunix_step.seq_len, *compile_step.xla_costs_of(tunix_step.step.compiled),
      extra_flops=tunix_step.image_flops)
