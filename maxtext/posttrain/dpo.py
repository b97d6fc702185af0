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
  if method == "dpo" and dpo.reference == "initial":
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
    tunix_hooks.run_our_step(trainer, has_aux=True)
    preempted = runtime_lib.train_until_stopped(
        trainer, preference_data.PreferenceBatches(pairs, rows,
                                                   config.train.seed),
        eval_batches, every=config.train.microbatches)
  return runtime_lib.finish(config, workdir, loaded, trainer,
                            preempted=preempted)
