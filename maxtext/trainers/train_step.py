"""One training update: `train_step(state, batch) -> (state, metrics)`.

Pure and jitted once at module level; the input state is donated, so its
buffers are reused for the output state. The loss is the masked mean
next-token cross-entropy; with `z_loss > 0` the train step adds
`z_loss * mean(log(Z)^2)` (Z the softmax normaliser), which keeps the output
logits from drifting (PaLM). The model runs under `nnx.capture`, which
collects what it sows (`maxtext.models.decoder`). Losses it sows as
`moe.AuxLoss` (mixture-of-experts load balancing and router z-loss, already
weighted; DeepSeek Sparse Attention's indexer losses, logged as
`train/indexer_loss`) are added to the objective; `train/loss` stays the
cross-entropy. Parameters the state does not train (`TrainState.trainable`)
get zero gradients, so their backward pass is not computed.
The experts' statistics it sows (`nnx.Intermediate` "moe_metrics" and
"expert_load") become `moe/*` metrics, and after the update the model moves
its router bias against the step's expert loads (`update_router_bias`,
DeepSeek's auxiliary-loss-free balancing; the bias is model state, not a
parameter, so neither gradients nor the optimizer touch it). With
multi-token prediction (DeepSeek-V3, `maxtext.models.mtp`) the model sows
each depth's logits; `mtp_loss_weight` times their mean cross-entropy is
added to the objective and logged unweighted as `train/mtp_loss`.

With `state.microbatches = M > 1` the batch is cut into M slices (row i goes
to slice i % M, so each slice stays spread over the batch shards) and a
`lax.scan` accumulates their token-weighted gradients; the update equals that
of one step on the whole batch. Activations are constrained by the state's
compute rules (`axes.activation_sharding`).

Shapes: B batch, L length, V vocab.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from maxtext.common import axes
from maxtext.layers import moe
from maxtext.models import mtp
from maxtext.optim import optimizer
from maxtext.optim import update_guard
from maxtext.trainers import loop
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers.train_state import TrainState


@jax.custom_vjp
def log_z_and_target_logit(logits_BLV: jax.Array, targets_BL: jax.Array
                           ) -> tuple[jax.Array, jax.Array]:
  """(log Z, the target's logit) [B, L] of float32 logits [B, L, V].

  The gradient is one elementwise pass over the logits,
  g_z * softmax + g_t * one_hot, with the softmax from the exponentials the
  forward pass keeps; autodiff of the target's gather would instead
  zero-fill a [B, L, V] buffer and scatter into it. Both outputs partition
  over a vocabulary split across devices (`maxtext.layers.vocab_parallel`):
  log Z with [B, L]-sized all-reduces, the gather as a masked local gather.
  """
  return _log_z_and_target_logit(logits_BLV, targets_BL)[0]


def _is_target(logits_BLV: jax.Array, targets_BL: jax.Array) -> jax.Array:
  return (jnp.arange(logits_BLV.shape[-1], dtype=jnp.int32) ==
          targets_BL[..., None].astype(jnp.int32))


def _log_z_and_target_logit(logits_BLV, targets_BL):
  max_BL = logits_BLV.max(-1)
  # A row of -inf logits would give inf - inf (as in jax.nn.logsumexp).
  max_BL = jnp.where(jnp.isfinite(max_BL), max_BL, 0.0)
  exp_BLV = jnp.exp(logits_BLV - max_BL[..., None])
  sum_BL = exp_BLV.sum(-1)
  log_z_BL = max_BL + jnp.log(sum_BL)
  target_logit_BL = jnp.take_along_axis(
      logits_BLV, targets_BL[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return (log_z_BL, target_logit_BL), (exp_BLV, sum_BL, targets_BL)


def _log_z_and_target_logit_bwd(residuals, grads):
  exp_BLV, sum_BL, targets_BL = residuals
  g_log_z_BL, g_target_BL = grads
  d_logits_BLV = (g_log_z_BL / sum_BL)[..., None] * exp_BLV + jnp.where(
      _is_target(exp_BLV, targets_BL), g_target_BL[..., None], 0.0)
  return d_logits_BLV, None


log_z_and_target_logit.defvjp(_log_z_and_target_logit,
                              _log_z_and_target_logit_bwd)


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
  log_z_BL, target_logit_BL = log_z_and_target_logit(
      logits_BLV.astype(jnp.float32), targets_BL)
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
    `grads/global_norm` (before clipping), when the z-loss is on
    `train/z_loss` (its weighted term, added to the objective), with an
    update guard (`maxtext.optim.update_guard`) `train/skipped` and
    `train/skipped_steps`, and with experts the layers' means of
    `moe/load_balance_loss`, `moe/router_z_loss` (both unweighted),
    `moe/dropped_fraction` (of the token-expert assignments) and
    `moe/load_imbalance` (max over mean expert load), and with multi-token
    prediction `train/mtp_loss` (unweighted), with DeepSeek Sparse
    Attention `train/indexer_loss` (the sum over layers of each indexer's
    mean KL); and `loop.STATE_FINITE_METRIC`,
    whether the new state is finite.
  """
  return apply_gradients(state, *loss_and_grads(state, batch))


def apply_gradients(state: TrainState, loss: jax.Array, z_term: jax.Array,
                    grads, moe_stats: dict) -> tuple[TrainState, dict]:
  """`train_step`'s update from `loss_and_grads(state, batch)`'s results:
  the new state and the metrics. Traced inside `train_step`; a test that
  also inspects the gradients jits both halves together (one forward and
  backward pass)."""
  moe_stats = dict(moe_stats)
  # The loss goes to transformations that take it (`update_guard`).
  tx = optax.with_extra_args_support(state.tx)
  updates, opt_state = tx.update(grads, state.opt_state, state.params,
                                 value=loss)
  params = optax.apply_updates(state.params, updates)
  metrics = {
      "train/loss": loss,
      "train/learning_rate": state.schedule(state.step),
      "grads/global_norm": optax.tree.norm(grads),
  }
  if state.z_loss:  # Static: part of the compiled program.
    metrics["train/z_loss"] = state.z_loss * z_term
  metrics.update(update_guard.step_metrics(opt_state))
  for name in ("mtp_loss", "indexer_loss"):  # Static: what the model has.
    if name in moe_stats:
      metrics[f"train/{name}"] = moe_stats.pop(name)
  model_state = state.model_state
  if moe_stats:  # Static: the model has experts.
    expert_load_lE = moe_stats.pop("expert_load")
    metrics.update({f"moe/{name}": value
                    for name, value in moe_stats.items()})
    metrics["moe/load_imbalance"] = moe.load_imbalance(expert_load_lE)
    model = state.model()
    model.update_router_bias(expert_load_lE)
    model_state = optimizer.keep_frozen_state(
        train_state_lib.split_model(model)[2], state.model_state,
        state.trainable)
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state, model_state=model_state)
  # Checked with the metrics, before the state can be saved (`loop`).
  metrics[loop.STATE_FINITE_METRIC] = train_state_lib.all_finite(
      (params, opt_state, model_state))
  return new_state, metrics


def loss_and_grads(state: TrainState, batch: dict[str, jax.Array]
                   ) -> tuple[jax.Array, jax.Array, object, dict]:
  """Cross-entropy, z-term, gradients of the objective on `batch` and the
  experts' statistics.

  Traced inside `train_step`; jit it to inspect gradients. The statistics
  are empty without experts, else the sown "moe_metrics" scalars plus
  "expert_load" [expert layers, experts] (with microbatches, all are
  means over the microbatches).
  """

  def loss_fn(params, batch):
    params = optimizer.stop_frozen_gradients(params, state.trainable)
    model = state.replace(params=params).model()
    forward = nnx.capture(model, moe.AuxLoss, mtp.MtpLogits, nnx.Intermediate)
    with axes.activation_sharding(state.rules):
      # Packed batches carry per-segment positions and segment ids.
      logits_BLV, aux_losses, mtp_logits, intermediates = forward(
          batch["inputs"], positions_BL=batch.get("positions"),
          segment_ids_BL=batch.get("segment_ids"))
    loss, z_term = cross_entropy(logits_BLV, batch["targets"], batch["mask"])
    # Losses the model sows (mixture of experts: load balance, router z-loss).
    model_loss = sum(jax.tree.leaves(aux_losses))
    stats = _moe_stats(intermediates)
    sown_losses = nnx.to_pure_dict(aux_losses)
    if "indexer_loss" in sown_losses:  # DeepSeek Sparse Attention.
      stats["indexer_loss"] = sown_losses["indexer_loss"]
    mtp_loss = _mtp_loss(mtp_logits, batch)
    if mtp_loss is not None:  # Multi-token prediction (DeepSeek-V3).
      stats["mtp_loss"] = mtp_loss
      model_loss += model.cfg.mtp.loss_weight * mtp_loss
    return (loss + state.z_loss * z_term + model_loss,
            (loss, z_term, stats))

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if state.microbatches == 1:
    (_, (loss, z_term, moe_stats)), grads = grad_fn(state.params, batch)
    return loss, z_term, grads, moe_stats
  return _accumulate(grad_fn, state, batch)


def _mtp_loss(mtp_logits: nnx.State,
              batch: dict[str, jax.Array]) -> jax.Array | None:
  """Mean over the multi-token prediction depths of their cross-entropy
  (`mtp.mtp_targets`); None when the model sowed no `mtp_logits` (the
  captured `mtp.MtpLogits`)."""
  sown = jax.tree.leaves(mtp_logits)
  if not sown:
    return None
  losses = []
  for depth, logits_BLV in enumerate(sown, 1):
    targets_BL, mask_BL = mtp.mtp_targets(depth, batch["targets"],
                                          batch["mask"],
                                          batch.get("segment_ids"))
    losses.append(cross_entropy(logits_BLV[:, :-depth], targets_BL,
                                mask_BL)[0])
  return sum(losses) / len(losses)


def _moe_stats(intermediates: nnx.State) -> dict[str, jax.Array]:
  """The experts' statistics the model sowed (empty without experts), from
  its captured `nnx.Intermediate` values."""
  sown = nnx.to_pure_dict(intermediates)
  if not sown:
    return {}
  return {**sown["moe_metrics"], "expert_load": sown["expert_load"]}


def _accumulate(grad_fn, state: TrainState, batch: dict[str, jax.Array]):
  """Loss, z-term and gradients of `batch`, summed over microbatches.

  Each microbatch's mean loss and gradients are weighted by its number of
  target tokens, and the sums divided by the batch's, so the result is the
  whole batch's masked mean.
  """
  count = state.microbatches
  size = batch["inputs"].shape[0]
  if size % count:
    raise ValueError(f"Batch size {size} is not divisible by"
                     f" train.microbatches={count}.")

  def split(x_BL):
    x_MBL = x_BL.reshape(size // count, count,
                         *x_BL.shape[1:]).swapaxes(0, 1)
    with axes.activation_sharding(state.rules):
      return axes.constrain(x_MBL, (None, axes.BATCH, axes.LENGTH))

  micro = {key: split(value) for key, value in batch.items()}

  def body(carry, microbatch):
    loss_sum, z_sum, grad_sum = carry
    (_, (loss, z_term, moe_stats)), grads = grad_fn(state.params, microbatch)
    weight = microbatch["mask"].astype(jnp.float32).sum()
    grad_sum = jax.tree.map(
        lambda total, g: total + weight * g.astype(jnp.float32), grad_sum,
        grads)
    return ((loss_sum + weight * loss, z_sum + weight * z_term, grad_sum),
            moe_stats)

  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32),
                       state.params)
  (loss_sum, z_sum, grad_sum), moe_stats = jax.lax.scan(
      body, (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros),
      micro)
  total = jnp.maximum(batch["mask"].astype(jnp.float32).sum(), 1.0)
  grads = jax.tree.map(lambda g, p: (g / total).astype(p.dtype), grad_sum,
                       state.params)
  return (loss_sum / total, z_sum / total, grads,
          jax.tree.map(lambda x: x.mean(0), moe_stats))
