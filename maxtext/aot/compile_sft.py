"""Compiles the sft train step (its `PeftTrainer`'s step) for a target.

`compile_sft_step(config, hardware)` builds what `sft` trains without reading
any weight: the model of the `train.load` checkpoint's config, its LoRA
adapters and optimizer, as `maxtext.aot.compile_tunix` builds them, in a
`maxtext.posttrain.adapter.TunixModel` as `base_model.load_model` wraps it.
It then compiles the step the sft trainer runs, our `train_step` with
`sft_loss` (`maxtext.posttrain.step`), with the optimizer `sft` trains
with (`sft.make_optimizer`: a vision tower frozen), on one batch of
`train.rows` rows of `data.seq_len` tokens (and, with
`data.images_per_row`, their images at the tower's size) sharded like
Tunix's inputs (`compile_tunix.compile_tunix_step`). The sft
config is recognised by its `train.method` ("sft"; dpo/orpo are
`maxtext.aot.compile_preference`'s, distill `compile_distill`'s, the GRPO
step `compile_grpo`'s). `save` writes it for `sft --compiled`.

Shapes: B batch rows, L length.
"""

from maxtext.aot import compile_tunix
from maxtext.aot import topology as topology_lib
from maxtext.posttrain import adapter
from maxtext.posttrain import compiled_step
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import sft
from maxtext.posttrain.config import PosttrainConfig


def compile_sft_step(config: PosttrainConfig,
                     hardware: topology_lib.Hardware
                     ) -> compile_tunix.CompiledTunixStep:
  """Lowers and compiles the sft train step of `config` for `hardware`.

  Raises:
    compile_step.DoesNotFitError: the TPU compiler ran out of HBM.
    ValueError: `config` is not an sft config, or its mesh does not fit.
  """
  if config.train.method != "sft":
    raise ValueError(f"train.method={config.train.method!r}: this compiles"
                     " the 'sft' step (compile_preference: dpo and orpo;"
                     " compile_distill: distill).")
  runtime = runtime_lib.make_runtime(config, devices=hardware.devices)
  rows, seq_len = config.train.rows, config.data.seq_len
  model_cfg = compile_tunix.checkpoint_model_config(config.train.load)
  batch = sft.batch_specs(config, model_cfg)
  return compile_tunix.compile_tunix_step(
      config, hardware, runtime, model_cfg=model_cfg,
      model_cls=adapter.TunixModel, loss_fn=sft.sft_loss, has_aux=False,
      gen_model_input_fn=lambda inputs: inputs, batch=batch, rows=rows,
      seq_len=seq_len, tx=sft.make_optimizer(config, model_cfg),
      image_flops=sft.image_flops(config, model_cfg, rows))


def save(path: str, step: compile_tunix.CompiledTunixStep,
         config: PosttrainConfig) -> None:
  """Writes `step` (`compile_sft_step(config, ...)`) to `path` for
  `sft --compiled` (`maxtext.posttrain.compiled_step`). Compile it in a
  process with JAX's persistent compilation cache off from the start
  (`saved_step.disable_compilation_cache`): an executable the cache loaded
  does not serialise whole."""
  compiled_step.save(path, step.step.compiled, config, step.model_cfg,
                     step.step.mesh, step.batch)
