"""Dropless routed experts on a sharded batch: tokens moved between shards.

XLA cannot partition ragged_dot over experts (it would gather the expert
weights), so when the compute rules split the experts over `expert` (size >
1), the dropless path exchanges tokens itself (`expert_parallel_dropless`):
inside `jax.shard_map` each shard routes its tokens, sends each assignment
to the shard holding its expert, runs its local experts on what it received
and sends the results back, with `all_to_all` over `expert`. XLA:CPU lacks
`ragged_all_to_all`, so the exchange uses fixed buffers of Y rows per
destination shard (a sender's every assignment may go to one shard):
nothing is dropped, at the price of moving `expert` times more rows than a
ragged exchange would. When a shard holds at most k experts, gathering the
tokens moves and multiplies less: each shard runs its experts on the tokens
of its `expert` group (on CPU, only on the assignments to them) and
reduce-scatters the weighted sums back (`MoeConfig.expert_exchange`).

Without expert parallelism, XLA's own partitioning of the dropless path
gathers every token of the batch on every device (the sort by expert spans
the whole batch), so its buffers grow with the device count: Llama 4 Scout's
step (one row of 8192 tokens per v5p chip, FSDP, full remat) needed 117 GiB
of temporaries per chip over 32 chips and 136 GiB over 64. When the compute
rules split the tokens but keep each expert weight whole (FSDP gathers it,
as it gathers a dense layer's), the dropless path runs in `jax.shard_map` on
each shard's own tokens instead (`token_parallel_dropless`): each shard
sorts and multiplies only its own assignments (Scout over 32 chips: 62 GiB
of temporaries).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from maxtext.common import axes
from maxtext.kernels import gmm
from maxtext.layers import moe_experts
from maxtext.layers.moe_experts import ExpertWeights
from maxtext.layers.moe_experts import Routing

# The mesh axis the dropless path exchanges tokens over.
EXPERT_AXIS = "expert"


def sharded_dropless(x_TD, routing: Routing, w: ExpertWeights,
                     exchange: str = "auto", chunks: int = 1) -> jax.Array:
  """`moe_experts.dropless_experts` as the active compute rules split the
  experts and tokens: `expert_parallel_dropless` (with `exchange` and
  `chunks`), `token_parallel_dropless`, or on the whole batch."""
  tokens = x_TD.shape[0]
  rules = expert_parallel_rules(w.gate_EDF.shape[0], tokens)
  if rules is not None:
    return expert_parallel_dropless(x_TD, routing, w, rules, exchange,
                                    chunks)
  token_rules = token_parallel_rules(w, tokens)
  if token_rules is not None:
    return token_parallel_dropless(x_TD, routing, w, token_rules)
  return moe_experts.dropless_experts(x_TD, routing, w)


def expert_parallel_rules(num_experts: int, tokens: int):
  """The active compute rules when they split the experts, and the batch's
  `tokens`, over the `expert` mesh axis (size > 1), else None."""
  rules = axes.current_constrainer()
  mesh = getattr(rules, "mesh", None)
  if mesh is None or mesh.shape[EXPERT_AXIS] == 1:
    return None
  if rules.compute_spec((moe_experts.EXPERTS,), (num_experts,)) != (
      jax.sharding.PartitionSpec(EXPERT_AXIS)):
    return None
  token_axes, = axes.spec_axes(
      rules.compute_spec((axes.BATCH,), (tokens,)), 1)
  return rules if EXPERT_AXIS in token_axes else None


def token_parallel_rules(w: ExpertWeights, tokens: int):
  """The active compute rules when they split the batch's `tokens` over
  some mesh axis and keep every expert weight whole, else None."""
  rules = axes.current_constrainer()
  mesh = getattr(rules, "mesh", None)
  if mesh is None:
    return None

  def splits(names, shape) -> bool:
    return any(mesh.shape[axis] > 1 for dim in axes.spec_axes(
        rules.compute_spec(names, shape), len(shape)) for axis in dim)

  weights = ((w.gate_EDF, (moe_experts.EXPERTS, axes.EMBED, axes.MLP)),
             (w.up_EDF, (moe_experts.EXPERTS, axes.EMBED, axes.MLP)),
             (w.down_EFD, (moe_experts.EXPERTS, axes.MLP, axes.EMBED)))
  if splits((axes.BATCH,), (tokens,)) and not any(
      splits(names, array.shape) for array, names in weights):
    return rules
  return None


def token_parallel_dropless(x_TD, routing: Routing, w: ExpertWeights,
                            rules) -> jax.Array:
  """`moe_experts.dropless_experts` on each shard's own tokens (module
  doc), under `jax.shard_map` over `rules.mesh`: tokens and their routing
  split as the compute rules split the batch, every expert weight whole on
  every shard."""
  tokens_spec = rules.compute_spec((axes.BATCH, None), x_TD.shape)
  arrays = {name: value for name, value in vars(w).items()
            if isinstance(value, jax.Array)}

  def local(x_TD, experts_TA, weights_TA, arrays):
    return moe_experts.dropless_experts(
        x_TD, Routing(weights_TA, experts_TA, None, routing.on_input),
        dataclasses.replace(w, **arrays))

  return jax.shard_map(
      local, mesh=rules.mesh,
      in_specs=(tokens_spec, tokens_spec, tokens_spec,
                jax.sharding.PartitionSpec()),
      out_specs=tokens_spec)(x_TD, routing.experts_TA, routing.weights_TA,
                             arrays)


def expert_parallel_dropless(x_TD, routing: Routing, w: ExpertWeights,
                             rules, exchange: str = "auto",
                             chunks: int = 1) -> jax.Array:
  """`moe_experts.dropless_experts` with tokens moved between expert shards.

  Under `jax.shard_map` over `rules.mesh`: tokens (and their routing) split
  as the compute rules split the batch, expert weights by the `expert`
  axis. `exchange` (`maxtext.layers.moe.EXCHANGES`):
    "all_to_all": each shard sorts its assignments by expert, sends each
      to the shard holding its expert, runs its local experts on what it
      received (`moe_experts.grouped_experts`) and sends the results back
      (module doc). Fixed buffers: `expert` x the assignments move.
    "all_gather": each shard gathers the tokens of its `expert` group, runs
      its local experts on them and reduce-scatters the weighted sums back
      to the tokens' shards. Moves the tokens instead of `k` times their
      assignments. Where the grouped matmul skips unused rows
      (`gmm.skips_unused_rows`, CPU) a shard multiplies only the
      assignments to its experts (`moe_experts.routed_experts`); elsewhere
      every gathered token through each local expert, weighted by the
      routing (`moe_experts.dense_experts`: static shapes, `local` rows
      per token instead of `k`). `chunks` > 1: the gathered tokens in that
      many chunks, each under `jax.checkpoint` (`MoeConfig.expert_chunks`).
    "auto": all_gather when a shard holds at most k experts, else
      all_to_all.
  """
  tokens_spec = rules.compute_spec((axes.BATCH, None), x_TD.shape)
  arrays = {name: value for name, value in vars(w).items()
            if isinstance(value, jax.Array)}  # Each [E, ...].
  expert_spec = jax.sharding.PartitionSpec(EXPERT_AXIS)
  shards = rules.mesh.shape[EXPERT_AXIS]
  if exchange == "auto":
    local = w.gate_EDF.shape[0] // shards
    exchange = ("all_gather" if local <= routing.experts_TA.shape[1]
                else "all_to_all")
  run = (functools.partial(_exchange_tokens, shards=shards)
         if exchange == "all_to_all" else
         functools.partial(_gather_tokens, chunks=chunks))

  def exchanged(x_TD, experts_TA, weights_TA, local_arrays):
    return run(
        x_TD, Routing(weights_TA, experts_TA, None, routing.on_input),
        dataclasses.replace(w, **local_arrays))

  return jax.shard_map(
      exchanged, mesh=rules.mesh,
      in_specs=(tokens_spec, tokens_spec, tokens_spec, expert_spec),
      out_specs=tokens_spec)(x_TD, routing.experts_TA, routing.weights_TA,
                             arrays)


def _gather_tokens(x_TD, routing: Routing, w: ExpertWeights,
                   chunks: int) -> jax.Array:
  """One shard's part of `expert_parallel_dropless`'s "all_gather" (inside
  shard_map): `w` holds this shard's experts, global ids `index * local`
  on. Raises ValueError where `chunks` does not divide the tokens."""
  first = jax.lax.axis_index(EXPERT_AXIS) * w.gate_EDF.shape[0]
  gathered = tuple(jax.lax.all_gather(a, EXPERT_AXIS, tiled=True)
                   for a in (x_TD, routing.weights_TA, routing.experts_TA))

  def run(arrays):
    x_TD, weights_TA, experts_TA = arrays
    experts = (moe_experts.routed_experts if gmm.skips_unused_rows()
               else moe_experts.dense_experts)
    return experts(x_TD, Routing(weights_TA, experts_TA, None,
                                 routing.on_input), w, first)

  tokens = gathered[0].shape[0]
  if chunks == 1:
    y_TD = run(gathered)
  elif tokens % chunks:
    raise ValueError(
        f"model.moe_expert_chunks={chunks} does not divide the {tokens}"
        " tokens each expert shard gathers; use a divisor of it.")
  else:
    y_TD = jax.lax.map(jax.checkpoint(run), tuple(
        a.reshape(chunks, tokens // chunks, *a.shape[1:]) for a in gathered
    )).reshape(tokens, -1)
  return jax.lax.psum_scatter(y_TD, EXPERT_AXIS, tiled=True)


def _exchange_tokens(x_TD, routing: Routing, w: ExpertWeights,
                     shards: int) -> jax.Array:
  """One shard's part of `expert_parallel_dropless` (inside shard_map).

  `w` holds this shard's `local` experts, global ids `index * local` on.
  The all-to-all buffers are fixed-size: each shard may receive up to Y
  rows (all of a sender's assignments) from each of the `shards` senders,
  so nothing is dropped (XLA:CPU has no ragged-all-to-all).
  """
  tokens, k = routing.experts_TA.shape
  rows, local = tokens * k, w.gate_EDF.shape[0]
  order, expert_Y, sizes_E = moe_experts.sort_by_expert(routing, local * shards)
  # Send: shard p's rows (of its experts) go to buffer row p, from slot 0.
  dest_Y = expert_Y // local
  send_W = sizes_E.reshape(shards, local).sum(1)
  slot_Y = jnp.arange(rows) - (jnp.cumsum(send_W) - send_W)[dest_Y]
  send_WYD = jnp.zeros((shards, rows, x_TD.shape[-1]), x_TD.dtype).at[
      dest_Y, slot_Y].set(moe_experts.assignment_inputs(x_TD, routing, order))
  recv_WYD = jax.lax.all_to_all(send_WYD, EXPERT_AXIS, 0, 0)
  # Sender p's rows for this shard, sorted by (local) expert; then padding.
  all_sizes_WE = jax.lax.all_gather(sizes_E, EXPERT_AXIS)
  recv_sizes_WX = jax.lax.dynamic_slice_in_dim(
      all_sizes_WE, jax.lax.axis_index(EXPERT_AXIS) * local, local, axis=1)
  ends_WX = jnp.cumsum(recv_sizes_WX, axis=1)
  # Local expert of each received row; `local` marks padding.
  expert_J = jnp.sum(jnp.arange(rows)[None, :, None] >= ends_WX[:, None, :],
                     axis=-1).reshape(-1)
  recv_order = jnp.argsort(expert_J, stable=True)
  # Padding rows (zeros, results unused) read the last expert's biases.
  y_JD = moe_experts.grouped_experts(
      recv_WYD.reshape(shards * rows, -1)[recv_order],
      jnp.minimum(expert_J[recv_order], local - 1), recv_sizes_WX.sum(0), w)
  y_WYD = jnp.zeros_like(y_JD).at[recv_order].set(y_JD).reshape(
      shards, rows, -1)
  back_WYD = jax.lax.all_to_all(y_WYD, EXPERT_AXIS, 0, 0)
  return moe_experts.combine_outputs(back_WYD[dest_Y, slot_Y], routing,
                                     order, tokens)
