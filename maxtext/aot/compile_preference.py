"""Compiles the DPO/ORPO train step for a target.

`compile_preference_step(config, hardware)` builds what `sft` trains for a
`configs/dpo.py` config (`train.method` "dpo" or "orpo") without reading any
weight: the policy of the `train.load` checkpoint's config, its LoRA
adapters and optimizer, as `maxtext.aot.compile_tunix` builds them. It then
compiles the step the trainer runs (`maxtext.posttrain.step`) with the loss
it trains on, `maxtext.posttrain.preference_loss.loss`, and the method's
settings (`dpo.loss_inputs`), on one prepared batch (`dpo.batch_specs`):
`train.rows` pairs' chosen rows then rejected rows of `dpo.max_prompt_length
+ dpo.max_response_length` tokens, with the reference's summed
log-likelihoods for DPO with a reference. Scoring the reference is not part
of the step (the trainer does it once per batch slice, before it).
"""

from maxtext.aot import compile_tunix
from maxtext.aot import topology as topology_lib
from maxtext.posttrain import adapter
from maxtext.posttrain import dpo
from maxtext.posttrain import preference_loss
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain.config import PosttrainConfig


def compile_preference_step(config: PosttrainConfig,
                            hardware: topology_lib.Hardware
                            ) -> compile_tunix.CompiledTunixStep:
  """Lowers and compiles the DPO/ORPO train step of `config` for `hardware`;
  it returns (loss, aux, grad_norm), aux the trainer's metrics.

  Raises:
    compile_step.DoesNotFitError: the TPU compiler ran out of HBM.
    ValueError: `config` is not a dpo/orpo config, or its mesh does not fit.
  """
  if config.train.method not in preference_loss.ALGORITHMS:
    raise ValueError(f"train.method={config.train.method!r}: this compiles"
                     f" the {preference_loss.ALGORITHMS} steps.")
  runtime = runtime_lib.make_runtime(config, devices=hardware.devices)
  settings = config.dpo
  return compile_tunix.compile_tunix_step(
      config, hardware, runtime,
      model_cfg=compile_tunix.checkpoint_model_config(config.train.load),
      model_cls=adapter.TunixModel, loss_fn=preference_loss.loss,
      has_aux=True, gen_model_input_fn=dpo.loss_inputs(config),
      batch=dpo.batch_specs(config), rows=2 * config.train.rows,
      seq_len=settings.max_prompt_length + settings.max_response_length)
