"""DPO and ORPO on Tunix's `DPOTrainer` (`DPOTrainingConfig(algorithm=...)`).

Run by `//maxtext/bin:sft --config=configs/dpo.py[:orpo]` (one binary for
every method on one model; distillation, with two models, has its own).
Preference records come from `maxtext.posttrain.preference_data`. For DPO
the reference is a frozen copy of the starting model (`dpo.reference =
"initial"`) or none; ORPO never loads one. The trainer's loss is ours,
`maxtext.posttrain.preference_loss` (the papers' formulas; Tunix's trainer
still batches the pairs and scores the reference once per batch slice).
Full fine-tuning, LoRA and QLoRA work as in SFT (`lora.mode`), and the run
ends with the same export.

Metrics (per update, `train/` and `eval/`): loss, rewards/chosen,
rewards/rejected, rewards/margin, rewards/accuracy (the share of pairs whose
chosen reward is higher), log_probs/chosen, log_probs/rejected, and for ORPO
odds_ratio, sft_loss and or_loss.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from tunix.rl import common
from tunix.sft.dpo import dpo_trainer

from maxtext.posttrain import base_model
from maxtext.posttrain import preference_data
from maxtext.posttrain import preference_loss
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import tunix_hooks
from maxtext.posttrain.config import PosttrainConfig


def run_dpo(config: PosttrainConfig, workdir: str) -> runtime_lib.RunResult:
  """Preference-tunes `train.load` on `config.data` (method dpo or orpo)."""
  dpo = config.dpo
  method = config.train.method
  runtime = runtime_lib.make_runtime(config)
  data = config.data
  rows = config.train.rows
  pairs = preference_data.load_pairs(data, dpo, files=data.files,
                                     kind=data.source)
  eval_batches = None
  if data.eval_every_steps:
    eval_batches = preference_data.EvalPreferenceBatches(
        preference_data.load_pairs(data, dpo, files=data.eval_files,
                                   kind=data.eval_kind()),
        rows, data.eval_steps)
  loaded = base_model.load_model(config.train.load, lora=config.lora,
                                 seed=config.train.seed, rules=runtime.rules,
                                 execution=config.execution)
  reference = None
  if has_reference(config):
    reference = base_model.load_model(config.train.load,
                                      rules=runtime.rules,
                                      execution=config.execution).model
  length = dpo.max_prompt_length + dpo.max_response_length
  with runtime.activate():
    trainer = dpo_trainer.DPOTrainer(
        loaded.model, reference, runtime_lib.make_optimizer(config),
        runtime_lib.training_config(
            config, workdir, runtime, length,
            cls=dpo_trainer.DPOTrainingConfig, algorithm=method,
            beta=dpo.beta, lambda_orpo=dpo.lambda_orpo,
            label_smoothing=dpo.label_smoothing))
    # Our DPO/ORPO loss, the papers' (same arguments and metrics as Tunix's).
    trainer.with_loss_fn(preference_loss.loss, has_aux=True)
    trainer.with_gen_model_input_fn(loss_inputs(config))
    tunix_hooks.run_our_step(trainer, has_aux=True)
    preempted = runtime_lib.train_until_stopped(
        trainer, preference_data.PreferenceBatches(pairs, rows,
                                                   config.train.seed),
        eval_batches, every=config.train.microbatches)
  return runtime_lib.finish(config, workdir, loaded, trainer,
                            preempted=preempted)


def has_reference(config: PosttrainConfig) -> bool:
  """Whether the run scores a frozen reference (DPO with `dpo.reference`
  "initial"; ORPO never does)."""
  return config.train.method == "dpo" and config.dpo.reference == "initial"


def loss_inputs(config: PosttrainConfig
                ) -> Callable[[dpo_trainer.TrainExample], dict[str, Any]]:
  """`preference_loss.loss`'s keyword arguments from one prepared batch:
  the method and its settings."""
  method, dpo = config.train.method, config.dpo
  settings = ({"lambda_orpo": dpo.lambda_orpo} if method == "orpo" else
              {"beta": dpo.beta})

  def inputs(example: dpo_trainer.TrainExample) -> dict[str, Any]:
    return {"train_example": example, "algorithm": method,
            "label_smoothing": dpo.label_smoothing, **settings}

  return inputs


def batch_specs(config: PosttrainConfig) -> dpo_trainer.TrainExample:
  """One prepared batch (Tunix's `TrainExample`: `train.rows` pairs'
  chosen rows then rejected rows, left-padded prompts then right-padded
  responses, the reference's summed log-likelihoods when there is one) as
  shapes and dtypes."""
  pairs, dpo = config.train.rows, config.dpo
  length = dpo.max_prompt_length + dpo.max_response_length
  # Token ids and masks are int32 (`preference_data`); the positions and
  # attention mask are what the trainer derives from the mask.
  tokens = jax.ShapeDtypeStruct((2 * pairs, length), jnp.int32)
  ref = (jax.ShapeDtypeStruct((pairs,), jnp.float32)
         if has_reference(config) else None)
  return dpo_trainer.TrainExample(
      input_ids=tokens,
      positions=jax.eval_shape(common.build_positions_from_mask, tokens),
      attention_mask=jax.eval_shape(common.make_causal_attn_mask, tokens),
      ref_chosen_logps=ref, ref_rejected_logps=ref,
      completion_mask=jax.ShapeDtypeStruct(
          (2 * pairs, dpo.max_response_length), jnp.int32),
      logits_to_keep=dpo.max_response_length)
