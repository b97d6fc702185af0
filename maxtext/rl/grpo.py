"""GRPO and GSPO on Tunix's `GRPOLearner` with our models.

`run(config, workdir)` is what `//maxtext/bin:grpo` runs:

- The policy starts from `train.load` (full, LoRA or QLoRA as in SFT), or
  from a random model of the `model` section (saved to
  <workdir>/initial_model first). With `rl.beta > 0` a frozen copy of the
  starting model is the reference of the KL term.
- Tunix's `RLCluster` holds three roles, all `maxtext.rl.policy
  .PolicyModel`s: the actor (trained), the reference and the rollout. The
  rollout engine is one config key, `rollout.engine`: "jax" (our sampler,
  `maxtext.rl.jax_rollout`) or "vllm" (`maxtext.rl.vllm_rollout`, imported
  only when chosen). `rollout.devices = N` gives the rollout its own mesh
  of the last N devices; the trainer's mesh gets the others.
- Every batch of `train.batch_size` prompts is sampled
  `rl.num_generations` times; the rewards (`maxtext.rl.rewards`, weighted
  and summed) give group-relative advantages; the policy takes
  `rl.num_iterations` clipped updates on them ("grpo": token-level
  importance ratio; "gspo-token": the sequence-level one).

Metrics (log, <workdir>/metrics.jsonl, TensorBoard): Tunix's
"<group>/<mode>/<name>" events written as "<mode>/<group>/<name>", e.g.
train/actor/loss, train/actor/kl, train/rewards/sum (the total reward),
train/rewards/<fn> (each weighted reward's mean), train/rewards/<fn>_std,
train/completions/mean_length, train/rollout/tokens_per_s and
train/rollout/seconds (the sampling's speed and wall time),
train/perf/batch_seconds (the wall time since the previous batch's
rewards: the policy update between them, this batch's rollouts and
scoring). The trained
policy is exported to <workdir>/export like an SFT run.
"""

import dataclasses
import functools
import os
import random
import shutil
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from absl import logging
from flax import nnx
import jax
import ml_collections
import numpy as np
from tunix.rl import function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from maxtext.checkpoint import params_checkpoint
from maxtext.data import chat_template as chat_lib
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.models import registry
from maxtext.posttrain import base_model
from maxtext.posttrain import rows as rows_lib
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import tunix_hooks
from maxtext.rl import dynamic_sampling
from maxtext.rl import jax_rollout
from maxtext.rl import policy as policy_lib
from maxtext.rl import rewards as rewards_lib
from maxtext.rl import toy_task
from maxtext.rl import word_problems
from maxtext.rl.config import RlRunConfig
from maxtext.rl.config import TOY_SOURCE
from maxtext.rl.config import WORD_PROBLEM_SOURCES
from maxtext.sharding import mesh as mesh_lib

TOY_DIRNAME = "toy"
WORD_PROBLEMS_DIRNAME = "word_problems"
INITIAL_MODEL_DIRNAME = "initial_model"
_MODES = ("train", "eval")


class RlMetricsBackend(runtime_lib.MetricsBackend):
  """Writes Tunix's RL events "<group>/<mode>/<name>" as
  "<mode>/<group>/<name>" (the post-training backend keeps only names that
  start with the mode)."""

  def log_scalar(self, event: str, value: Any, *, step: int | None = None,
                 **kwargs) -> None:
    parts = event.lstrip("/").split("/", 2)
    if len(parts) == 3 and parts[1] in _MODES:
      event = f"{parts[1]}/{parts[0]}/{parts[2]}"
    super().log_scalar(event, value, step=step, **kwargs)


def _data(config: RlRunConfig, workdir: str) -> RlRunConfig:
  """`config` with a generated task (the toy, the word problems) written to
  the workdir when asked, as JSONL files."""
  source = config.data.source
  if source == TOY_SOURCE:
    tokenizer, files = toy_task.write_task(os.path.join(workdir,
                                                        TOY_DIRNAME))
    data = dataclasses.replace(config.data, source="jsonl", files=files,
                               tokenizer=tokenizer, columns=("answer",))
  elif source in WORD_PROBLEM_SOURCES:
    folder = os.path.join(workdir, WORD_PROBLEMS_DIRNAME)
    os.makedirs(folder, exist_ok=True)
    train, heldout = word_problems.write_split(
        folder, WORD_PROBLEM_SOURCES[source])
    data = dataclasses.replace(config.data, source="jsonl", files=train,
                               eval_files=heldout, columns=("answer",))
  else:
    return config
  return dataclasses.replace(config, data=data)


def tokenizer_path(config: RlRunConfig) -> str:
  """`data.tokenizer`, else the starting checkpoint's tokenizer.json.

  Raises:
    ValueError: both `data.tokenizer` and `train.load` are empty.
  """
  if config.data.tokenizer:
    return config.data.tokenizer
  if not config.train.load:
    raise ValueError("data.tokenizer is empty and so is train.load: give"
                     " the tokenizer of a model trained from scratch.")
  return os.path.join(config.train.load, "tokenizer.json")


def _start_checkpoint(config: RlRunConfig, workdir: str,
                      vocab_size: int) -> str:
  """`train.load`, or a random model of the `model` section saved once to
  <workdir>/initial_model (a rerun reuses it)."""
  if config.train.load:
    return config.train.load
  cfg = config.model
  if cfg.vocab_size < vocab_size:
    raise ValueError(f"model.vocab_size={cfg.vocab_size} is smaller than"
                     f" the tokenizer's {vocab_size} tokens.")
  path = os.path.join(workdir, INITIAL_MODEL_DIRNAME)
  if not os.path.isdir(os.path.join(path, params_checkpoint.PARAMS_DIRNAME)):
    shutil.rmtree(path, ignore_errors=True)
    model = registry.create_model(cfg, rngs=nnx.Rngs(config.train.seed))
    params_checkpoint.save_converted(path, cfg,
                                     params_checkpoint.model_params(model))
    logging.info("Saved a random %s model to %s.", cfg.family, path)
  return path


def _prompts(config: RlRunConfig, tokenizer: tokenizer_lib.Tokenizer,
             files: str) -> list[dict[str, Any]]:
  """The records of `files`: {"prompts": text, column: value, ...}, the
  prompt rendered by `data.chat_template` when set."""
  data = config.data
  encoder = (chat_lib.ChatEncoder(chat_lib.load_template(data.chat_template),
                                  tokenizer) if data.chat_template else None)
  records = []
  for row in rows_lib.read_rows(data.source, files,
                                (data.prompt_field, *data.columns)):
    prompt = row.pop(data.prompt_field)
    if encoder:
      prompt = encoder.render([{"role": "user", "content": prompt}],
                              add_generation_prompt=True)
    records.append({"prompts": prompt, **row})
  if not records:
    raise ValueError(f"data.files={files!r} holds no records.")
  return records


def _batch(records: list[dict[str, Any]]) -> dict[str, np.ndarray]:
  """Columns as arrays (Tunix repeats each leaf per generation)."""
  return {key: np.asarray([r[key] for r in records]) for key in records[0]}


def train_batches(records: list[dict[str, Any]], batch_size: int,
                  seed: int) -> Iterator[dict[str, np.ndarray]]:
  """Batches of `batch_size` records, reshuffled every epoch, endless."""
  rng = random.Random(seed)
  order: list[int] = []
  while True:
    while len(order) < batch_size:
      epoch = list(range(len(records)))
      rng.shuffle(epoch)
      order += epoch
    yield _batch([records[i] for i in order[:batch_size]])
    order = order[batch_size:]


def _eval_batches(records: list[dict[str, Any]],
                  batch_size: int) -> list[dict[str, np.ndarray]]:
  """Whole batches of the eval records, one pass."""
  return [_batch(records[i:i + batch_size])
          for i in range(0, len(records) - batch_size + 1, batch_size)]


def trainer_devices(config: RlRunConfig,
                    devices: Sequence[jax.Device]) -> list[jax.Device]:
  """The devices of the trainer's mesh: all of `devices` but the last
  `rollout.devices` (the rollout's own, when that is not 0).

  Raises:
    ValueError: `rollout.devices` leaves the trainer no device.
  """
  split = config.rollout.devices
  if split >= len(devices):
    raise ValueError(f"rollout.devices={split} leaves no trainer device of"
                     f" the {len(devices)} ({devices[0].device_kind}); use"
                     " 0 (shared) or fewer.")
  return list(devices)[:len(devices) - split]


def _meshes(config: RlRunConfig) -> tuple[runtime_lib.Runtime,
                                          jax.sharding.Mesh]:
  """The trainer's runtime and the rollout mesh (`rollout.devices`)."""
  devices = jax.devices()
  trainer = trainer_devices(config, devices)
  runtime = runtime_lib.make_runtime(config, devices=trainer)
  if not config.rollout.devices:
    return runtime, runtime.mesh
  return runtime, mesh_lib.make_mesh(mesh_lib.MeshConfig(),
                                     devices[len(trainer):])


def rollout_engine(config: RlRunConfig, workdir: str) -> Any:
  """`ClusterConfig.rollout_engine` for `rollout.engine`."""
  if config.rollout.engine == "vllm":
    from maxtext.rl import vllm_rollout  # pylint: disable=g-import-not-at-top
    return functools.partial(
        vllm_rollout.VllmRollout, workdir=os.path.join(workdir, "vllm"),
        seed=config.train.seed)
  return functools.partial(jax_rollout.JaxRollout,
                           pad_to=config.rollout.pad_to,
                           seed=config.train.seed)


def rollout_config(config: RlRunConfig,
                   tokenizer: policy_lib.RlTokenizer
                   ) -> base_rollout.RolloutConfig:
  """Tunix's rollout config of the `rollout` section."""
  r = config.rollout
  stops = [tokenizer.eos_id()]
  for text in r.stop_tokens:
    ids = tokenizer.encode(text)
    if len(ids) != 1:
      raise ValueError(f"rollout.stop_tokens entry {text!r} is {len(ids)}"
                       " tokens; each stop token must be one token.")
    stops.append(ids[0])
  return base_rollout.RolloutConfig(
      max_tokens_to_generate=r.max_new_tokens, temperature=r.temperature,
      top_p=r.top_p, top_k=r.top_k or None,
      max_prompt_length=r.max_prompt_length,
      kv_cache_size=r.max_prompt_length + r.max_new_tokens,
      eos_tokens=stops, return_logprobs=True)


def grpo_config(config: RlRunConfig) -> grpo_learner.GRPOConfig:
  """Tunix's algorithm config of the `rl` section."""
  rl = config.rl
  algo = grpo_learner.GRPOConfig(
      loss_algo=rl.loss_algo, num_generations=rl.num_generations,
      num_iterations=rl.num_iterations, beta=rl.beta, epsilon=rl.epsilon,
      kl_loss_mode=rl.kl_loss_mode, loss_agg_mode=rl.loss_agg_mode,
      advantage_estimator=rl.advantage_estimator)
  # The upper clipping bound Tunix's policy loss reads (GRPOConfig
  # documents it; it is not one of its fields).
  algo.epsilon_high = rl.epsilon_high or rl.epsilon
  return algo


def _metric_fns(reward_fns, cluster: rl_cluster_lib.RLCluster):
  """Per-reward standard deviations, the rollout's speed and time, and the
  wall time of each batch's whole cycle."""
  previous = []

  def metrics(prompts, completions, rewards, advantages, **columns):
    del prompts, completions, advantages, columns
    # Tunix has just called each reward function on this batch.
    out = {f"rewards/{fn.__name__}_std": (float(np.std(fn.last_values)),
                                          np.mean)
           for fn in reward_fns}
    out["rewards/std"] = (float(np.std(rewards)), np.mean)
    rollout = cluster.rollout
    out["rollout/tokens_per_s"] = (rollout.last_tokens_per_s, np.mean)
    out["rollout/seconds"] = (rollout.last_seconds, np.mean)
    # Since the previous batch's rewards (train or eval): the policy update
    # between them (none between dynamic sampling's rounds), then this
    # batch's rollouts and scoring.
    now = time.perf_counter()
    if previous:
      out["perf/batch_seconds"] = (now - previous[-1], np.mean)
    previous[:] = [now]
    return out

  return [metrics]


def run_grpo(config: RlRunConfig, workdir: str) -> runtime_lib.RunResult:
  """Trains `train.load` (or a model from scratch) with GRPO/GSPO."""
  config = _data(config, workdir)
  config = dataclasses.replace(config, data=dataclasses.replace(
      config.data, tokenizer=tokenizer_path(config)))
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer)
  rl_tokenizer = policy_lib.RlTokenizer(tokenizer)
  runtime, rollout_mesh = _meshes(config)
  load = _start_checkpoint(config, workdir, tokenizer.vocab_size)
  records = _prompts(config, tokenizer, config.data.files)
  eval_data = None
  if config.data.eval_every_steps:
    eval_data = _eval_batches(
        _prompts(config, tokenizer, config.data.eval_files),
        config.train.batch_size)
  learner, loaded = make_learner(
      config, workdir, load=load, runtime=runtime, rollout_mesh=rollout_mesh,
      tokenizer=rl_tokenizer,
      # Dynamic sampling's further prompts: the records in another order.
      more_prompts=train_batches(records, config.train.batch_size,
                                 config.data.shuffle_seed + 1))
  with runtime.activate():
    preempted = runtime_lib.train_until_stopped(
        learner, train_batches(records, config.train.batch_size,
                               config.data.shuffle_seed), eval_data)
  # The actor trained the decoder `loaded` holds, unless Tunix moved it.
  actor_trainer = learner.rl_cluster.actor_trainer
  nnx.update(loaded.model.model, nnx.state(actor_trainer.model.model))
  return runtime_lib.finish(config, workdir, loaded, actor_trainer,
                            preempted=preempted)


def make_learner(config: RlRunConfig, workdir: str, *, load: str,
                 runtime: runtime_lib.Runtime,
                 rollout_mesh: jax.sharding.Mesh,
                 tokenizer: policy_lib.RlTokenizer,
                 more_prompts: Iterator[dict[str, np.ndarray]] | None = None
                 ) -> tuple[grpo_learner.GRPOLearner, base_model.LoadedModel]:
  """Tunix's GRPO learner of `config` on the checkpoint `load` (its policy,
  reference when `rl.beta` > 0, rollout engine, rewards and metrics), and
  the loaded policy model. With `rl.dynamic_sampling_rounds` its batches
  keep the informative groups (`dynamic_sampling`), sampling more from
  `more_prompts`.

  Raises:
    ValueError: dynamic sampling without `more_prompts`.
  """
  loaded = base_model.load_model(load, lora=config.lora,
                                 seed=config.train.seed, rules=runtime.rules,
                                 execution=config.execution)
  reference = None
  if config.rl.beta:
    reference = policy_lib.PolicyModel.of(
        base_model.load_model(load, rules=runtime.rules,
                              execution=config.execution).model)
  r = config.rollout
  training = runtime_lib.training_config(
      config, workdir, runtime, r.max_prompt_length + r.max_new_tokens,
      cls=rl_cluster_lib.RLTrainingConfig,
      actor_optimizer=runtime_lib.make_optimizer(config),
      mini_batch_size=config.train.mini_batch_size or None,
      metrics_backend=RlMetricsBackend)
  roles = rl_cluster_lib.Role
  cluster_config = rl_cluster_lib.ClusterConfig(
      role_to_mesh={roles.ACTOR: runtime.mesh, roles.REFERENCE: runtime.mesh,
                    roles.ROLLOUT: rollout_mesh},
      rollout_engine=rollout_engine(config, workdir),
      training_config=training,
      rollout_config=rollout_config(config, tokenizer))
  reward_fns = rewards_lib.make_reward_fns(
      config.rl.rewards, max_words=config.rl.max_words,
      max_length=r.max_new_tokens, overlong_buffer=config.rl.overlong_buffer,
      completion_lengths=lambda: cluster.rollout.last_lengths)
  with runtime.activate():
    cluster = rl_cluster_lib.RLCluster(
        actor=policy_lib.PolicyModel.of(loaded.model), reference=reference,
        tokenizer=tokenizer, cluster_config=cluster_config)
    learner_kwargs = {}
    learner_cls = grpo_learner.GRPOLearner
    rounds = config.rl.dynamic_sampling_rounds
    if rounds:
      if more_prompts is None:
        raise ValueError(f"rl.dynamic_sampling_rounds={rounds} needs more"
                         " prompts to sample from.")
      learner_cls = tunix_hooks.RolloutFilteringLearner
      learner_kwargs = dict(prompts=more_prompts, keep=functools.partial(
          dynamic_sampling.keep_informative,
          generations=config.rl.num_generations, max_rounds=rounds))
    learner = learner_cls(cluster, grpo_config(config), reward_fns,
                          metric_fns=_metric_fns(reward_fns, cluster),
                          **learner_kwargs)
  # The actor trains on our binding of the learner's loss, in our step.
  actor = cluster.actor_trainer
  actor.with_loss_fn(actor_loss(learner.algo_config, cluster.rollout.pad_id(),
                                cluster.rollout.eos_id()), has_aux=True)
  actor.with_gen_model_input_fn(actor_inputs)
  tunix_hooks.run_our_step(actor, has_aux=True)
  return learner, loaded


def actor_loss(algo: grpo_learner.GRPOConfig, pad_id: int, eos_id: int
               ) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
  """The actor's loss, `loss(model, train_example) -> (loss, aux)`: Tunix's
  registered policy loss `algo.policy_loss_fn` (GRPO or GSPO-token
  clipping, KL to the reference, entropy; aux holds kl, pg_clipfrac, ...)
  with `algo` and the tokenizer's padding and EOS ids, as `GRPOLearner`
  binds it. `make_learner` trains on it and `aot_compile` compiles it."""
  policy_loss = function_registry.get_policy_loss_fn(algo.policy_loss_fn)

  def loss(model, train_example):
    return policy_loss(model, train_example, algo_config=algo,
                       pad_id=pad_id, eos_id=eos_id)

  return loss


def actor_inputs(train_example: grpo_learner.TrainExample
                 ) -> dict[str, grpo_learner.TrainExample]:
  """`actor_loss`'s keyword arguments from one policy update's batch."""
  return {"train_example": train_example}


def run(config: ml_collections.ConfigDict,
        workdir: str) -> runtime_lib.RunResult:
  """Runs the RL `config` in `workdir`.

  Raises:
    ValueError: the config is invalid (names the key).
  """
  return run_grpo(*runtime_lib.start(config, workdir, RlRunConfig))
