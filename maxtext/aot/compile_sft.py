"""Compiles the sft train step (Tunix's `PeftTrainer` step) for a target.

`compile_sft_step(config, hardware)` builds what `sft` trains without reading
any weight: the model of the `train.load` checkpoint's config, its LoRA
adapters and optimizer, as `maxtext.aot.compile_tunix` builds them, in a
`maxtext.posttrain.adapter.TunixModel` as `base_model.load_model` wraps it.
It then compiles Tunix's own train step, `PeftTrainer._train_step` with
`sft_loss` and the optimizer `sft` trains with (`sft.make_optimizer`: a
vision tower frozen), on one batch of `train.rows` rows of `data.seq_len`
tokens (and, with `data.images_per_row`, their images at the tower's size)
sharded like Tunix's inputs (`compile_tunix.compile_tunix_step`). The sft
config is recognised by its `train.method` ("sft"; the GRPO step is
`maxtext.aot.compile_grpo`'s, dpo and distill are not compiled ahead of time
yet).

Shapes: B batch rows, L length.
"""

import jax
import jax.numpy as jnp

from maxtext.aot import compile_tunix
from maxtext.aot import topology as topology_lib
from maxtext.data import packing
from maxtext.data import pipeline
from maxtext.posttrain import adapter
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
    raise ValueError(f"train.method={config.train.method!r}: aot_compile"
                     " compiles the 'sft' post-training step only (and the"
                     " grpo step of an RL config).")
  runtime = runtime_lib.make_runtime(config, devices=hardware.devices)
  rows, seq_len = config.train.rows, config.data.seq_len
  model_cfg = compile_tunix.checkpoint_model_config(config.train.load)
  batch = {key: jax.ShapeDtypeStruct((rows, seq_len), jnp.int32)
           for key in pipeline.MODEL_KEYS}
  per_row = config.data.images_per_row
  if per_row:
    if not model_cfg.vision.layers:
      raise ValueError(
          f"data.images_per_row={per_row} needs a model with a vision tower;"
          f" the {model_cfg.family} model of {config.train.load} has none.")
    side = model_cfg.vision.image_size
    batch[packing.IMAGES] = jax.ShapeDtypeStruct(
        (rows, per_row, side, side, 3), jnp.float32)
  return compile_tunix.compile_tunix_step(
      config, hardware, runtime, model_cfg=model_cfg,
      model_cls=adapter.TunixModel, loss_fn=sft.sft_loss, has_aux=False,
      gen_model_input_fn=lambda inputs: inputs, batch=batch, rows=rows,
      seq_len=seq_len, tx=sft.make_optimizer(config, model_cfg),
      image_flops=sft.image_flops(config, model_cfg, rows))
