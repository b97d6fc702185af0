"""Compiles the distillation train step for a target.

`compile_distill_step(config, hardware)` builds what `distill` trains
without reading any weight: the student of the `train.load` checkpoint's
config with its LoRA adapters and optimizer, as `maxtext.aot.compile_tunix`
builds them, its `distill.feature_layers` blocks wrapped to sow their
outputs as the trainer wraps them. It then compiles the step the trainer
runs (`maxtext.posttrain.step`) with the loss it trains on, the
`DistillStrategy`'s `get_train_loss` (the student's forward pass, KL to the
teacher at the temperature, cross-entropy, feature loss, the schedules), on
one batch: `train.rows` packed rows of `data.seq_len` tokens, the update
index, and the teacher's outputs (logits, and the compared blocks' outputs)
as the teacher of the `distill.teacher` checkpoint's config gives them. The
teacher's forward pass is not part of the step (the trainer runs it before,
on the same batch).
"""

from flax import nnx
import jax
import jax.numpy as jnp

from maxtext.aot import compile_tunix
from maxtext.aot import topology as topology_lib
from maxtext.data import pipeline
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.posttrain import distill
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain.config import PosttrainConfig


def _batch(config: PosttrainConfig, strategy: distill.DistillStrategy
           ) -> dict[str, dict[str, jax.ShapeDtypeStruct]]:
  """One batch as the trainer's step receives it: {"inputs": the model
  keys and the update index, "teacher_output": the teacher's outputs}."""
  rows, seq_len = config.train.rows, config.data.seq_len
  inputs = {key: jax.ShapeDtypeStruct((rows, seq_len), jnp.int32)
            for key in pipeline.MODEL_KEYS}
  inputs[distill.STEP_KEY] = jax.ShapeDtypeStruct((), jnp.int32)
  teacher_cfg = compile_tunix.checkpoint_model_config(config.distill.teacher)

  def teacher_outputs(inputs):
    teacher = adapter.TunixModel(registry.create_model(teacher_cfg,
                                                       rngs=nnx.Rngs(0)))
    strategy.capture_teacher(teacher)
    return strategy.get_teacher_outputs(teacher, inputs)

  return {"inputs": inputs,
          "teacher_output": jax.eval_shape(teacher_outputs, inputs)}


def compile_distill_step(config: PosttrainConfig,
                         hardware: topology_lib.Hardware
                         ) -> compile_tunix.CompiledTunixStep:
  """Lowers and compiles the distillation train step of `config` for
  `hardware`; it returns (loss, aux, grad_norm), aux the distill metrics.

  Raises:
    compile_step.DoesNotFitError: the TPU compiler ran out of HBM.
    ValueError: `config` is not a distill config, or its mesh does not fit.
  """
  if config.train.method != "distill":
    raise ValueError(f"train.method={config.train.method!r}: this compiles"
                     " the 'distill' step.")
  runtime = runtime_lib.make_runtime(config, devices=hardware.devices)
  strategy = distill.DistillStrategy(config.distill, config.train.steps)
  return compile_tunix.compile_tunix_step(
      config, hardware, runtime,
      model_cfg=compile_tunix.checkpoint_model_config(config.train.load),
      model_cls=adapter.TunixModel, loss_fn=strategy.get_train_loss,
      has_aux=True, gen_model_input_fn=lambda batch: batch,
      batch=_batch(config, strategy), rows=config.train.rows,
      seq_len=config.data.seq_len, prepare=strategy.capture_student)
