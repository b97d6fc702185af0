"""AdamW with warmup + cosine decay, global-norm clipping and a decay mask.

Learning rate at update `s` (0-based), with peak `lr`, `W = warmup_steps`,
`T = decay_steps` (the update at which decay ends; -1 means the run's total
number of updates) and `r = end_learning_rate_ratio`:

  s <  W:      lr * (s + 1) / W          (linear warmup; update 0 is not wasted)
  W <= s < T:  lr * (r + (1 - r) * (1 + cos(pi * (s - W) / (T - W))) / 2)
  s >= T:      lr * r

(When T <= W the rate is `lr * r` from update W on.)

Weight decay is decoupled (AdamW: `p -= lr * weight_decay * p`) and applies
to matmul kernels and the embedding table (embeddings decay like weights):
every parameter of two or more dimensions whose leaf name is not `scale` or
`bias`. Norm scales and biases are not decayed: pulling them towards zero
changes the function's normalisation rather than limiting its capacity. The
name test keeps layer-stacked (scanned) norm scales, which are 2-D, undecayed.

A model may train only some of its parameters (DeepSeek Sparse Attention's
dense warm-up trains its indexer only: `maxtext.layers.mla`): a predicate
`trainable(names)` of a parameter's path names picks them;
`stop_frozen_gradients` makes the others' gradients zero (so their backward
pass is not even computed), `keep_frozen` zeroes their updates (no weight
decay either) and `keep_frozen_state` keeps the model's other state (a
router bias) as it was.
"""

from collections.abc import Callable
import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

# Leaf names that are never decayed, whatever their rank.
NO_DECAY_NAMES = ("scale", "bias")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
  """The `optimizer` config section.

  Attributes:
    learning_rate: Peak learning rate.
    warmup_steps: Updates of linear warmup.
    decay_steps: Update at which the cosine decay ends; -1 means the run's
      total number of updates (`train.steps`).
    end_learning_rate_ratio: Final learning rate over the peak.
    b1: Adam first-moment decay.
    b2: Adam second-moment decay.
    eps: Adam denominator epsilon.
    weight_decay: Decoupled weight decay (multiplied by the learning rate).
    grad_clip_norm: Clip gradients to this global norm; 0 turns clipping off.
    z_loss: Weight of the z-loss `log(Z)^2` added by the train step.
  """

  learning_rate: float
  warmup_steps: int
  decay_steps: int
  end_learning_rate_ratio: float
  b1: float
  b2: float
  eps: float
  weight_decay: float
  grad_clip_norm: float
  z_loss: float

  def __post_init__(self):
    def check(name, ok, requirement):
      if not ok:
        raise ValueError(
            f"optimizer.{name}={getattr(self, name)!r} is invalid: it must be"
            f" {requirement}.")

    check("learning_rate", self.learning_rate > 0, "positive")
    check("warmup_steps", self.warmup_steps >= 0, ">= 0")
    check("decay_steps", self.decay_steps == -1 or self.decay_steps > 0,
          "positive, or -1 for the run's length")
    check("end_learning_rate_ratio", 0 <= self.end_learning_rate_ratio <= 1,
          "in [0, 1]")
    check("b1", 0 <= self.b1 < 1, "in [0, 1)")
    check("b2", 0 <= self.b2 < 1, "in [0, 1)")
    check("eps", self.eps > 0, "positive")
    check("weight_decay", self.weight_decay >= 0, ">= 0")
    check("grad_clip_norm", self.grad_clip_norm >= 0, ">= 0 (0 is off)")
    check("z_loss", self.z_loss >= 0, ">= 0 (0 is off)")


def learning_rate_schedule(config: OptimizerConfig,
                           total_steps: int) -> optax.Schedule:
  """The schedule of the module docstring, as a jittable function of step."""
  peak = config.learning_rate
  warmup = config.warmup_steps
  decay_end = total_steps if config.decay_steps == -1 else config.decay_steps
  ratio = config.end_learning_rate_ratio

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = peak * (step + 1.0) / max(warmup, 1)
    if decay_end > warmup:
      progress = jnp.clip((step - warmup) / (decay_end - warmup), 0.0, 1.0)
    else:
      progress = jnp.ones_like(step)
    cosine = peak * (ratio + (1.0 - ratio) * 0.5 *
                     (1.0 + jnp.cos(math.pi * progress)))
    return jnp.where(step < warmup, warm, cosine)

  return schedule


def path_names(path) -> tuple[str, ...]:
  """The names along a `jax.tree_util` key path."""
  def name(key):
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        return str(getattr(key, attr))
    return str(key)

  return tuple(name(key) for key in path)


def weight_decay_mask(params):
  """True for parameters that get weight decay (see the module docstring)."""
  def decays(path, leaf) -> bool:
    names = path_names(path)
    if names and names[-1] in NO_DECAY_NAMES:
      return False
    return jnp.ndim(leaf) >= 2

  return jax.tree_util.tree_map_with_path(decays, params)


Trainable = Callable[[tuple[str, ...]], bool] | None


def _frozen_to(trainable: Trainable, frozen: Callable[..., Any], tree,
               *others):
  """`tree` with each leaf `trainable` rejects replaced by `frozen(leaf,
  *the same leaf of others)` (`trainable` None: `tree` as it is)."""
  if trainable is None:
    return tree
  return jax.tree_util.tree_map_with_path(
      lambda path, x, *rest: x if trainable(path_names(path))
      else frozen(x, *rest), tree, *others)


def stop_frozen_gradients(params, trainable: Trainable):
  """`params` with the gradients of those `trainable` rejects stopped
  (`trainable` None: all train)."""
  return _frozen_to(trainable, jax.lax.stop_gradient, params)


def keep_frozen(trainable: Trainable) -> optax.GradientTransformation:
  """Zeroes the updates of the parameters `trainable` rejects (None: every
  parameter trains, and the updates pass unchanged); stateless."""

  def update_fn(updates, state, params=None):
    del params
    return _frozen_to(trainable, jnp.zeros_like, updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def keep_frozen_state(new, old, trainable: Trainable):
  """Model state `new` where `trainable` accepts the path, else `old` (a
  frozen model's non-parameter state, e.g. its router bias, stays)."""
  return _frozen_to(trainable, lambda _, kept: kept, new, old)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """`optax.clip_by_global_norm` as one multiply: updates times
  min(1, max_norm / global norm).

  optax's divides each leaf by the norm; XLA does not copy a divide into the
  several fusions that read its result, so its clipped gradients were
  materialized (a kernel and a pass over the gradients per leaf), where a
  multiply by a scalar fuses into the Adam moments' updates. Under the
  threshold the updates pass unchanged (the factor is exactly 1), over it
  they agree with optax's to rounding; a non-finite norm gives what optax's
  gives.
  """

  def update_fn(updates, state, params=None):
    del params
    factor = jnp.minimum(1.0, max_norm / optax.tree.norm(updates))
    return jax.tree.map(lambda t: t * factor.astype(t.dtype), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def make_optimizer(config: OptimizerConfig,
                   total_steps: int) -> optax.GradientTransformation:
  """Clip-by-global-norm then AdamW with the schedule and the decay mask.

  Args:
    config: The optimizer section.
    total_steps: The run's number of updates (resolves `decay_steps=-1`).

  Returns:
    The optax transformation; its updates are added to the parameters.
  """
  transforms = []
  if config.grad_clip_norm > 0:
    transforms.append(clip_by_global_norm(config.grad_clip_norm))
  transforms.append(optax.adamw(
      learning_rate=learning_rate_schedule(config, total_steps),
      b1=config.b1, b2=config.b2, eps=config.eps,
      weight_decay=config.weight_decay, mask=weight_decay_mask))
  return optax.chain(*transforms)

