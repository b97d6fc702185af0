"""Compiles the GRPO policy update (the actor step of Tunix's GRPO learner)
for a target.

`compile_grpo_step(config, hardware)` builds what `grpo` trains without
reading any weight: the policy of the `train.load` checkpoint's config (or
of the `model` section, for a run from scratch), its LoRA adapters and
optimizer, as `maxtext.aot.compile_tunix` builds them, in a
`maxtext.rl.policy.PolicyModel` as the RL cluster's actor is. It then
compiles the step the actor trainer runs (`maxtext.posttrain.step`) with
the loss it trains on, `grpo.actor_loss`: Tunix's registered policy loss of
`GRPOConfig.policy_loss_fn` (GRPO or GSPO-token clipping, KL to the
reference, entropy) at the rollout's temperature, with the tokenizer's
padding and EOS ids, returning (loss, aux).

The batch is one policy update's `TrainExample` of rollout shapes:
`train.rows` prompts x `rl.num_generations` completions, left-padded
prompts of `rollout.max_prompt_length` tokens, completions padded to
`rollout.max_new_tokens`, one advantage per completion, the reference's
per-token log-probs when `rl.beta` > 0 and the old policy's when
`rl.num_iterations` > 1 (otherwise None, as the learner leaves them). The
rollout (sampling) and the reference and old-policy scoring are not part of
the step. With `rollout.devices` = N the step is compiled for the
trainer's share of the target: all devices but the last N.

Shapes: N completions (prompts x generations), P prompt length, T
completion length.
"""

import tempfile

import jax
import jax.numpy as jnp
from tunix.rl.grpo import grpo_learner

from maxtext.aot import compile_tunix
from maxtext.aot import topology as topology_lib
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.posttrain import runtime as runtime_lib
from maxtext.rl import grpo
from maxtext.rl import policy as policy_lib
from maxtext.rl import toy_task
from maxtext.rl.config import RlRunConfig
from maxtext.rl.config import TOY_SOURCE


def token_ids(config: RlRunConfig) -> tuple[int, int]:
  """(padding id, EOS id) of the run's tokenizer, as the rollout gives them
  to the learner: the toy task's, `data.tokenizer` or the starting
  checkpoint's tokenizer.json (only the tokenizer file is read).

  Raises:
    ValueError: there is no tokenizer to read (names the keys).
  """
  if config.data.source == TOY_SOURCE:
    with tempfile.TemporaryDirectory() as folder:
      path, _ = toy_task.write_task(folder)
      tokenizer = policy_lib.RlTokenizer(tokenizer_lib.load_tokenizer(path))
  else:
    tokenizer = policy_lib.RlTokenizer(
        tokenizer_lib.load_tokenizer(grpo.tokenizer_path(config)))
  return tokenizer.pad_id(), tokenizer.eos_id()


def _algo_config(config: RlRunConfig) -> grpo_learner.GRPOConfig:
  """The learner's algorithm config (`GRPOLearner` sets the temperature
  from the rollout config)."""
  algo = grpo.grpo_config(config)
  algo.temperature = config.rollout.temperature
  return algo


def _train_example(config: RlRunConfig) -> grpo_learner.TrainExample:
  """One policy update's abstract batch (see the module docstring)."""
  completions = config.train.rows * config.rl.num_generations
  prompt_BL = (completions, config.rollout.max_prompt_length)
  completion_BI = (completions, config.rollout.max_new_tokens)
  logps_BI = jax.ShapeDtypeStruct(completion_BI, jnp.float32)
  return grpo_learner.TrainExample(
      prompt_ids=jax.ShapeDtypeStruct(prompt_BL, jnp.int32),
      prompt_mask=jax.ShapeDtypeStruct(prompt_BL, jnp.bool_),
      completion_ids=jax.ShapeDtypeStruct(completion_BI, jnp.int32),
      completion_mask=jax.ShapeDtypeStruct(completion_BI, jnp.bool_),
      advantages=jax.ShapeDtypeStruct((completions,), jnp.float32),
      ref_per_token_logps=logps_BI if config.rl.beta else None,
      old_per_token_logps=(logps_BI if config.rl.num_iterations > 1
                           else None))


def compile_grpo_step(config: RlRunConfig, hardware: topology_lib.Hardware
                      ) -> compile_tunix.CompiledTunixStep:
  """Lowers and compiles the GRPO policy update of `config` for `hardware`.

  The compiled step returns (loss, aux, grad_norm) like the actor trainer's
  jitted step; aux holds the learner's metrics (kl, pg_clipfrac, ...).

  Raises:
    compile_step.DoesNotFitError: the TPU compiler ran out of HBM.
    ValueError: the mesh does not fit, or there is no tokenizer.
  """
  runtime = runtime_lib.make_runtime(
      config, devices=grpo.trainer_devices(config, hardware.devices))
  model_cfg = (compile_tunix.checkpoint_model_config(config.train.load)
               if config.train.load else
               config.model.replace(scan_layers=False))
  rollout = config.rollout
  return compile_tunix.compile_tunix_step(
      config, hardware, runtime, model_cfg=model_cfg,
      model_cls=policy_lib.PolicyModel,
      loss_fn=grpo.actor_loss(_algo_config(config), *token_ids(config)),
      has_aux=True, gen_model_input_fn=grpo.actor_inputs,
      batch=_train_example(config),
      rows=config.train.rows * config.rl.num_generations,
      seq_len=rollout.max_prompt_length + rollout.max_new_tokens)
