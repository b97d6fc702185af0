"""One training update: `train_step(state, batch) -> (state, metrics)`.

Pure and jitted once at module level; the input state is donated, so its
buffers are reused for the output state. The loss is the masked mean
next-token cross-entropy; with `z_loss > 0` the train step adds
`z_loss * mean(log(Z)^2)` (Z the softmax normaliser), which keeps the output
logits from drifting (PaLM).

Shapes: B batch, L length, V vocab.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from maxtext.trainers.train_state import TrainState


def cross_entropy(logits_BLV: jax.Array, targets_BL: jax.Array,
                  mask_BL: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Masked mean cross-entropy and masked mean log(Z)^2.

  Args:
    logits_BLV: float32 logits.
    targets_BL: Target token ids.
    mask_BL: 1 where the target counts, 0 on padding.

  Returns:
    (loss, z_loss_term), float32 scalars; both 0 when the mask is empty.
  """
  logits_BLV = logits_BLV.astype(jnp.float32)
  log_z_BL = jax.nn.logsumexp(logits_BLV, axis=-1)
  target_logit_BL = jnp.take_along_axis(
      logits_BLV, targets_BL[..., None].astype(jnp.int32), axis=-1)[..., 0]
  weights_BL = mask_BL.astype(jnp.float32)
  denominator = jnp.maximum(weights_BL.sum(), 1.0)
  loss = ((log_z_BL - target_logit_BL) * weights_BL).sum() / denominator
  z_term = (jnp.square(log_z_BL) * weights_BL).sum() / denominator
  return loss, z_term


@functools.partial(jax.jit, donate_argnums=0)
def train_step(state: TrainState,
               batch: dict[str, jax.Array]) -> tuple[TrainState, dict]:
  """Applies one update on `batch` {"inputs", "targets", "mask"} [B, L].

  Returns:
    The new state and scalar metrics of this update: `train/loss` (the
    cross-entropy, before the update), `train/learning_rate`,
    `grads/global_norm` (before clipping) and, when the z-loss is on,
    `train/z_loss` (its weighted term, added to the objective).
  """

  def loss_fn(params):
    model = state.replace(params=params).model()
    logits_BLV = model(batch["inputs"])
    loss, z_term = cross_entropy(logits_BLV, batch["targets"], batch["mask"])
    return loss + state.z_loss * z_term, (loss, z_term)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (_, (loss, z_term)), grads = grad_fn(state.params)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {
      "train/loss": loss,
      "train/learning_rate": state.schedule(state.step),
      "grads/global_norm": optax.tree.norm(grads),
  }
  if state.z_loss:  # Static: part of the compiled program.
    metrics["train/z_loss"] = state.z_loss * z_term
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state)
  return new_state, metrics
