"""Evaluation: `eval_step(state, batch)` and the loop over an eval split.

`eval_step` runs the model without gradients and returns the summed masked
cross-entropy and the number of target tokens of one batch; `evaluate` sums
them over all batches, so that `eval/loss` is the mean over every token of
the split (not a mean of per-batch means) and `eval/perplexity` its exp.

Shapes: B batch, L length, V vocab.
"""

from collections.abc import Callable, Iterable, Mapping
import math

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common import axes
from maxtext.trainers import train_step as train_step_lib
from maxtext.trainers.train_state import TrainState


@jax.jit
def eval_step(state: TrainState,
              batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Loss sum and target count of `batch` {"inputs", "targets", "mask"} (and
  "positions", "segment_ids" when packed) [B, L], float32 scalars."""
  model = state.model()
  with axes.activation_sharding(state.rules):
    logits_BLV = model(batch["inputs"], positions_BL=batch.get("positions"),
                       segment_ids_BL=batch.get("segment_ids"))
  loss, _ = train_step_lib.cross_entropy(logits_BLV, batch["targets"],
                                         batch["mask"])
  tokens = batch["mask"].astype(jnp.float32).sum()
  return {"loss_sum": loss * tokens, "tokens": tokens}


def evaluate(state: TrainState, batches: Iterable[Mapping[str, jax.Array]],
             step_fn: Callable = eval_step) -> dict[str, float]:
  """`eval/loss`, `eval/perplexity` and `eval/tokens` over `batches`."""
  totals = None
  for batch in batches:
    out = step_fn(state, batch)
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  if totals is None:
    raise ValueError("The evaluation split gave no batches.")
  totals = jax.tree.map(np.asarray, jax.device_get(totals))
  tokens = float(totals["tokens"])
  loss = float(totals["loss_sum"]) / max(tokens, 1.0)
  return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 700.0)),
          "eval/tokens": tokens}
