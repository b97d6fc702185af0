"""Compiles the sft train step (Tunix's `PeftTrainer` step) for a target.

`compile_sft_step(config, hardware)` builds what `sft` trains without reading
any weight: the model of the `train.load` checkpoint's config (unscanned,
LoRA/QLoRA adapters as `lora` asks, parameter metadata in mesh axes, wrapped
in `maxtext.posttrain.adapter.TunixModel`, as `base_model.load_model` builds
it) and its `nnx.Optimizer` (the run's optimizer, `optax.MultiSteps` with
`train.microbatches`, over the adapters only under LoRA), all as abstract
arrays laid out on the target's mesh by their partition specs (the layout
Tunix gives them). It then lowers and compiles Tunix's own train step,
`PeftTrainer._train_step` with `sft_loss`, under `nnx.jit` with the
optimizer donated, as `PeftTrainer.jit_train_and_eval_step` does, on one
batch of `train.rows` rows of `data.seq_len` tokens sharded like Tunix's
inputs. The result has the same memory, FLOPs and collectives report as
the `train` step (`maxtext.aot.compile_step`). The sft config is recognised
by its `train.method` ("sft"; the other post-training methods are not
compiled ahead of time yet).

Shapes: B batch rows, L length.
"""

import dataclasses
import functools
import time

from flax import nnx
import jax
import jax.numpy as jnp
import optax
from tunix.sft import peft_trainer

from maxtext.aot import compile_step
from maxtext.aot import topology as topology_lib
from maxtext.checkpoint import params_checkpoint
from maxtext.common.model_config import ModelConfig
from maxtext.data import pipeline
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.posttrain import base_model
from maxtext.posttrain import lora as lora_lib
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import sft
from maxtext.posttrain.config import PosttrainConfig
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib


@dataclasses.dataclass(frozen=True)
class CompiledSftStep:
  """A compiled sft step and what it was built from.

  Attributes:
    step: The compiled step, its target and mesh (`inputs` is None).
    nnx_compiled: The `nnx.jit` compiled step: on CPU targets it runs here,
      called as `(model, optimizer, batch)` like Tunix's jitted step
      (updates model and optimizer in place, returns (loss, aux,
      grad_norm)); the model and optimizer must have the graph definition
      of `abstract` (`merge`).
    abstract: The (model, optimizer) pair it was lowered with.
    model_cfg: The model as `sft` trains it (unscanned).
    rows: Rows of one step's batch (`train.rows`).
    seq_len: Tokens per row.
    batch_sharding: Layout of each [rows, seq_len] batch array.
  """

  step: compile_step.CompiledStep
  nnx_compiled: object
  abstract: tuple[adapter.TunixModel, nnx.Optimizer]
  model_cfg: ModelConfig
  rows: int
  seq_len: int
  batch_sharding: jax.sharding.NamedSharding

  def merge(self, state: nnx.State
            ) -> tuple[adapter.TunixModel, nnx.Optimizer]:
    """(model, optimizer) in the graph the step was compiled for, holding
    `state`, that of a real pair (`nnx.state((model, optimizer))`, e.g. a
    Tunix trainer's). Graph definitions hold per-instance objects (the
    attention kernel) that compare by identity, so the real pair's own
    graph does not match the compiled one."""
    return nnx.merge(nnx.graphdef(self.abstract), state)


def _abstract_model(config: PosttrainConfig, rules: rules_lib.LogicalRules,
                    tx: optax.GradientTransformation
                    ) -> tuple[adapter.TunixModel, nnx.Optimizer, ModelConfig]:
  """The model `base_model.load_model` builds for `config` and its
  optimizer (sharing it, as in a trainer), abstract."""
  checkpoint_cfg, _ = params_checkpoint.load_params(config.train.load,
                                                    lazy=True)
  cfg = dataclasses.replace(checkpoint_cfg, scan_layers=False)
  lora = config.lora
  seed = config.train.seed

  def build() -> tuple[adapter.TunixModel, nnx.Optimizer]:
    adapted = lora.mode != "full"
    # As in load_model: adapters are created on a first call without remat.
    model = registry.create_model(
        dataclasses.replace(cfg, remat_policy="none", remat_custom=())
        if adapted else cfg, rngs=nnx.Rngs(seed))
    base_model._to_mesh_axes(model, rules)  # pylint: disable=protected-access
    if adapted:
      model = lora_lib.apply_lora(model, lora, seed=seed,
                                  example_tokens=jnp.zeros((1, 8), jnp.int32))
      model.cfg = cfg
    model = adapter.TunixModel(model, rules)
    return model, nnx.Optimizer(model, tx,
                                wrt=base_model.trainable_filter(model))

  return *nnx.eval_shape(build), cfg


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


def _tunix_train_step(loss_fn, lora_enabled: bool):
  """Tunix's `PeftTrainer._train_step` with `loss_fn`, bound to a trainer
  holding only what it reads (a real trainer needs real arrays)."""
  trainer = peft_trainer.PeftTrainer.__new__(peft_trainer.PeftTrainer)
  trainer.loss_fn = loss_fn
  trainer.gen_model_input_fn = lambda inputs: inputs
  trainer._lora_enabled = lora_enabled  # pylint: disable=protected-access
  trainer._has_aux = False  # pylint: disable=protected-access
  return functools.partial(peft_trainer.PeftTrainer._train_step, trainer)  # pylint: disable=protected-access


def compile_sft_step(config: PosttrainConfig,
                     hardware: topology_lib.Hardware) -> CompiledSftStep:
  """Lowers and compiles the sft train step of `config` for `hardware`.

  Raises:
    compile_step.DoesNotFitError: the TPU compiler ran out of HBM.
    ValueError: `config` is not an sft config, or its mesh does not fit.
  """
  if config.train.method != "sft":
    raise ValueError(f"train.method={config.train.method!r}: aot_compile"
                     " compiles the 'sft' post-training step only.")
  mesh = mesh_lib.make_mesh(config.mesh, hardware.devices)
  rules = rules_lib.LogicalRules.from_config(mesh, config.sharding)
  runtime = runtime_lib.Runtime(mesh=mesh, rules=rules)
  train = config.train
  if train.rows % rules.batch_shards():
    raise ValueError(
        f"train.batch_size / train.microbatches = {train.rows} rows must"
        f" divide over the {rules.batch_shards()} batch shards of the mesh.")
  tx = runtime_lib.make_optimizer(config)
  if train.microbatches > 1:
    tx = optax.MultiSteps(tx, train.microbatches)
  model, optimizer, cfg = _abstract_model(config, rules, tx)
  model, optimizer = _placed((model, optimizer), mesh)
  lora_enabled = base_model.trainable_filter(model) is nnx.LoRAParam
  seq_len = config.data.seq_len
  batch_sharding = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(*runtime.data_axes(train.rows,
                                                          seq_len)))
  batch = {key: jax.ShapeDtypeStruct((train.rows, seq_len), jnp.int32,
                                     sharding=batch_sharding)
           for key in pipeline.MODEL_KEYS}
  step_fn = nnx.jit(_tunix_train_step(sft.sft_loss, lora_enabled),
                    donate_argnames=("optimizer",))
  start = time.perf_counter()
  with runtime.activate():
    lowered = step_fn.lower(model, optimizer, batch)
    compiled = compile_step.compile_lowered(lowered.lowered, hardware)
  nnx_compiled = nnx.transforms.compilation.Compiled(compiled, step_fn)
  step = compile_step.CompiledStep(
      compiled=compiled, hardware=hardware, mesh=mesh, inputs=None,
      compile_time_s=time.perf_counter() - start)
  return CompiledSftStep(step=step, nnx_compiled=nnx_compiled,
                         abstract=(model, optimizer),
                         model_cfg=cfg, rows=train.rows, seq_len=seq_len,
                         batch_sharding=batch_sharding)


def analyse(sft_step: CompiledSftStep) -> compile_step.StepReport:
  """Memory, FLOPs and collectives of the sft step, per device.

  Our FLOP count is that of full training (LoRA trains fewer weights).
  """
  return compile_step.report(
      sft_step.step, sft_step.model_cfg, sft_step.rows, sft_step.seq_len,
      *compile_step.xla_costs_of(sft_step.step.compiled))
