"""Where our code reaches Tunix beyond its public classes and functions:
the one module that does, so that a Tunix upgrade is checked here.

- `run_our_step`: a trainer jits our `step.train_step`. Tunix's
  trainers jit what `create_train_step_fn()` returns (a public method
  meant to be overridden; `jit_train_and_eval_step` calls it); ours
  answers it on the trainer itself, which also covers the RL actor trainer that `RLCluster`
  creates.
- `run_compiled_step`: a trainer calls a step compiled ahead of time
  instead of jitting its own. It answers the public
  `jit_train_and_eval_step` with the loaded step in place of the jitted
  one; Tunix's train loop reads the step's `func.jitted_fn` (to log its
  cache size), which the loaded step gives.
- `RolloutFilteringLearner`: Tunix's `GRPOLearner` whose batches of
  rollouts (with their advantages) pass through a function of ours before
  training, which may sample more (RL's dynamic sampling); it overrides
  `_generate_and_compute_advantage`, the learner's per-batch rollout and
  advantage step.
- `SOW_TAG`: where Tunix's `SowedModule` (feature distillation) keeps the
  output it sows (a private class constant).
- `in_eval`, `buffer_train_metric`: the trainer's mode and its buffer of
  per-step metrics (private attributes), for `_prepare_inputs` and
  `_post_process_train_step`, the per-batch hooks Tunix's trainers document
  for subclasses (maxtext.posttrain.distill overrides them).

Checked against google-tunix 0.1.7 (the locked version).
"""

from collections.abc import Callable, Iterator
import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from tunix.distillation import feature_extraction
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.sft import metrics_logger
from tunix.sft import peft_trainer

from maxtext.posttrain import step as step_lib

SOW_TAG = feature_extraction.SowedModule._SOW_TAG  # pylint: disable=protected-access


def run_our_step(trainer: peft_trainer.PeftTrainer, *, has_aux: bool) -> None:
  """Makes `trainer` jit `step_lib.for_model` of its model and of its loss
  and input function (read when it first jits, after any `with_loss_fn`);
  `has_aux` must be what the trainer's loss returns."""
  trainer.create_train_step_fn = lambda: step_lib.for_model(
      trainer.model, trainer.loss_fn, has_aux=has_aux,
      gen_model_input_fn=trainer.gen_model_input_fn)


def run_compiled_step(trainer: peft_trainer.PeftTrainer,
                      compiled: Callable[..., Any]) -> None:
  """Makes `trainer` train with `compiled`, called as `compiled(model,
  optimizer, batch)` like its jitted step (its eval step is unchanged)."""
  jit_both = trainer.jit_train_and_eval_step

  def jit_train_and_eval_step(skip_jit: bool = False,
                              cache_nnx_graph: bool = False):
    jitted, eval_step = jit_both(skip_jit, cache_nnx_graph)
    if skip_jit:
      return jitted, eval_step
    return functools.partial(
        _LoadedStep(compiled, jitted.func.jitted_fn), trainer.model,
        trainer.optimizer), eval_step

  trainer.jit_train_and_eval_step = jit_train_and_eval_step


@dataclasses.dataclass(frozen=True)
class _LoadedStep:
  """A loaded step; `jitted_fn` is the jitted step it replaces (never
  called), read by Tunix's train loop for its cache size."""

  compiled: Callable[..., Any]
  jitted_fn: Any

  def __call__(self, model, optimizer, batch):
    return self.compiled(model, optimizer, batch)


class RolloutFilteringLearner(grpo_learner.GRPOLearner):
  """`GRPOLearner` training on `keep(batch, more)` of each training batch
  of rollouts, where `more()` samples and scores the next batch of
  `prompts` (an iterator of batches as the learner's data gives them);
  `keep` returns the batch to train on and metrics to log."""

  def __init__(self, *args, keep: Callable[[Any, Callable[[], Any]],
                                           tuple[Any, dict[str, float]]],
               prompts: Iterator[dict[str, Any]], **kwargs):
    super().__init__(*args, **kwargs)
    self.keep = keep
    self.prompts = prompts

  def _generate_and_compute_advantage(self, training_input, mode=None):
    mode = mode or rl_cluster_lib.Mode.TRAIN
    generate = super()._generate_and_compute_advantage
    batch = generate(training_input, mode)
    if mode != rl_cluster_lib.Mode.TRAIN:
      return batch
    repeats = self.algo_config.num_generations

    def more():
      # As the learner's data pipeline repeats each prompt.
      return generate(jax.tree.map(lambda x: np.repeat(x, repeats, axis=0),
                                   next(self.prompts)), mode)

    batch, metrics = self.keep(batch, more)
    self.rl_cluster.buffer_metrics(
        {name: (value, np.mean) for name, value in metrics.items()},
        mode=mode)
    return batch


def in_eval(trainer: peft_trainer.PeftTrainer) -> bool:
  """Whether `trainer` is running its evaluation."""
  return trainer._mode == metrics_logger.Mode.EVAL  # pylint: disable=protected-access


def buffer_train_metric(trainer: peft_trainer.PeftTrainer, name: str,
                        value: Any) -> None:
  """Adds one step's `value` of metric `name` to what `trainer` logs (the
  mean over the logging interval)."""
  buffered = trainer._buffered_train_metrics.additional_metrics  # pylint: disable=protected-access
  buffered.setdefault(name, ([], np.mean))[0].append(value)
