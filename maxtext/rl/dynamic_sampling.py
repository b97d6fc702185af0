"""DAPO's dynamic sampling (Yu et al. 2025, section 3.2) with static shapes.

A group (one prompt's `rl.num_generations` completions) whose rewards are
all equal has zero advantages under every estimator (grpo, drgrpo, rloo):
it adds nothing to the policy gradient but its tokens still count in the
loss's normalisation. `keep_informative` keeps the informative groups of a batch's
rollouts and samples more batches (`more()`, fresh prompts) until it has as
many informative groups as the batch has, or `max_rounds` batches were
sampled; the batch it returns has the first one's shape exactly (the same
number of rows, prompt and completion lengths), so the train step compiles
once. When the rounds run out, uninformative groups fill the rest (in the
order sampled), as DAPO's implementation then trains on a partial batch.

Shapes: N completions (groups x generations).
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def informative(advantages_N: Any, generations: int) -> np.ndarray:
  """Per group: whether any of its advantages is non-zero (its rewards
  differ)."""
  return np.any(np.asarray(advantages_N).reshape(-1, generations) != 0,
                axis=1)


def keep_informative(first: Any, more: Callable[[], Any], *,
                     generations: int,
                     max_rounds: int) -> tuple[Any, dict[str, float]]:
  """`first` (a rollout batch, Tunix's `TrainExample` of N completions)
  with its uninformative groups replaced by informative ones sampled with
  `more()` (another such batch), at most `max_rounds` batches in all.

  Returns:
    The batch (`first`'s shapes and order of fields; informative groups in
    the order sampled) and its statistics: "dynamic_sampling/rounds",
    "dynamic_sampling/informative" (the share of `first`'s groups that
    were) and "dynamic_sampling/filled" (the share of the returned groups
    that are).
  """
  rounds = [first]
  flags = [informative(first.advantages, generations)]
  groups = flags[0].size
  kept = int(flags[0].sum())
  while kept < groups and len(rounds) < max_rounds:
    rounds.append(more())
    flags.append(informative(rounds[-1].advantages, generations))
    kept += int(flags[-1].sum())
  stats = {"dynamic_sampling/rounds": float(len(rounds)),
           "dynamic_sampling/informative": float(flags[0].mean()),
           "dynamic_sampling/filled": min(kept, groups) / groups}
  if flags[0].all():  # Every group informative: the batch as it is.
    return first, stats
  order = np.concatenate([np.flatnonzero(f) + i * groups
                          for i, f in enumerate(flags)] +
                         [np.flatnonzero(~f) + i * groups
                          for i, f in enumerate(flags)])[:groups]
  rows = (order[:, None] * generations + np.arange(generations)).ravel()
  return jax.tree.map(lambda *parts: jnp.concatenate(parts)[rows],
                      *rounds), stats
