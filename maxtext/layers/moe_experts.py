"""The routed experts of a mixture of experts, given a routing decision.

A `Routing` (`maxtext.layers.moe.route`) gives each token its k experts and
their weights; the functions here run the chosen experts on the tokens and
sum each token's expert outputs times their weights.

Each expert is a gated MLP (`maxtext.layers.mlp.GATED_UNITS`); with
`expert_bias` its projections add per-expert biases (GPT-OSS), and with
`expert_gate_up_fused` its gate and up projections are one parameter
`gate_up` [E, D, 2, F].

Three ways to run the routed experts, equal whenever nothing is dropped:
  "dropless": the T*k (token, expert) assignments are sorted by expert and
    each expert's contiguous run goes through a grouped matmul
    (`maxtext.kernels.gmm`); no token is ever dropped.
  "capacity": each expert has C = ceil(capacity_factor * T * k / E) slots,
    filled in token order; assignments past C are dropped (their weight is
    lost) and counted. Fixed shapes [E, C, D].
  "dense": every expert runs on every token and the outputs are combined
    with one-hot weights; the reference.

Expert parallelism: expert weights carry the logical axis "experts" (the
rule tables map it to the `expert` mesh axis). The capacity path constrains
its dispatched tokens [E, C, D] to the same axis, so XLA exchanges tokens
between the batch shards and the expert shards (all-to-all) and each device
runs only its experts. XLA cannot partition ragged_dot over experts (it
would gather the expert weights), so when the compute rules split the
experts over `expert` (size > 1), the dropless path exchanges tokens itself
(`expert_parallel_dropless`): inside `jax.shard_map` each shard routes its
tokens, sends each assignment to the shard holding its expert, runs its
local experts on what it received and sends the results back, with
`all_to_all` over `expert`. XLA:CPU lacks `ragged_all_to_all`, so the
exchange uses fixed buffers of Y rows per destination shard (a sender's
every assignment may go to one shard): nothing is dropped, at the price of
moving `expert` times more rows than a ragged exchange would. When a shard
holds at most k experts, gathering the tokens moves and multiplies less:
each shard runs its experts on every token of its `expert` group and
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

# Logical axis of the expert dimension of expert weights and of tokens
# dispatched to experts.
EXPERTS = "experts"
_DISPATCHED = (EXPERTS, None, axes.EMBED)
# The mesh axis the dropless path exchanges tokens over.
EXPERT_AXIS = "expert"


@dataclasses.dataclass(frozen=True)
class Routing:
  """A router's decision for T tokens.

  Attributes:
    weights_TA: Weight of each chosen expert in the token's output.
    experts_TA: The chosen experts (int32).
    probs_TE: Router probabilities (scores normalised over the experts),
      for the load-balancing loss.
    on_input: The weights scale each chosen expert's input instead of its
      output (Llama 4).
  """

  weights_TA: jax.Array
  experts_TA: jax.Array
  probs_TE: jax.Array
  on_input: bool = False


def expert_counts(experts_TA: jax.Array, num_experts: int) -> jax.Array:
  """Assignments per expert [E] (int32)."""
  return jnp.bincount(experts_TA.reshape(-1), length=num_experts).astype(
      jnp.int32)


@dataclasses.dataclass(frozen=True)
class ExpertWeights:
  """The routed experts' gated MLPs, in the compute dtype.

  Attributes:
    gate_EDF: Gate projections.
    up_EDF: Up projections.
    down_EFD: Down projections.
    gated_unit: (gate, up) -> hidden (`maxtext.layers.mlp.GATED_UNITS`).
    gate_up_bias_E2F: Biases of the gate ([:, 0]) and up ([:, 1])
      projections, or None.
    down_bias_ED: Biases of the down projections, or None.
  """

  gate_EDF: jax.Array
  up_EDF: jax.Array
  down_EFD: jax.Array
  gated_unit: object
  gate_up_bias_E2F: jax.Array | None = None
  down_bias_ED: jax.Array | None = None

  def hidden(self, gate_xF, up_xF, index) -> jax.Array:
    """Gated unit of gate and up projections [..., F] whose experts'
    biases are `bias_EF[index]` (broadcasting against them)."""
    if self.gate_up_bias_E2F is not None:
      gate_xF = gate_xF + self.gate_up_bias_E2F[:, 0][index]
      up_xF = up_xF + self.gate_up_bias_E2F[:, 1][index]
    return self.gated_unit(gate_xF, up_xF)

  def output(self, y_xD, index) -> jax.Array:
    """Down projections [..., D] plus their experts' biases
    `bias_ED[index]`."""
    if self.down_bias_ED is None:
      return y_xD
    return y_xD + self.down_bias_ED[index]


def dense_experts(x_TD, routing: Routing, w: ExpertWeights,
                  first_expert=0) -> jax.Array:
  """Reference: every expert on every token, one-hot combine. `w` holds the
  experts numbered `first_expert` on; assignments to others add nothing.
  Expert-major [E, T, ...] activations: each expert's matmuls are plain
  [T, D] x [D, F] ones, with no transposes between them."""
  ids_E = first_expert + jnp.arange(w.gate_EDF.shape[0])
  chosen_TAE = routing.experts_TA[..., None] == ids_E
  weights_TE = jnp.sum(jnp.where(
      chosen_TAE, routing.weights_TA[..., None].astype(x_TD.dtype), 0), 1)
  if routing.on_input:
    x_ETD = weights_TE.T[:, :, None] * x_TD[None]
    gate_ETF = jnp.einsum("etd,edf->etf", x_ETD, w.gate_EDF)
    up_ETF = jnp.einsum("etd,edf->etf", x_ETD, w.up_EDF)
    combine_TE = jnp.any(chosen_TAE, 1).astype(x_TD.dtype)
  else:
    gate_ETF = jnp.einsum("td,edf->etf", x_TD, w.gate_EDF)
    up_ETF = jnp.einsum("td,edf->etf", x_TD, w.up_EDF)
    combine_TE = weights_TE
  # Biases [E, ...] broadcast over the tokens.
  per_expert = (slice(None), None)
  h_ETF = w.hidden(gate_ETF, up_ETF, per_expert)
  y_ETD = w.output(jnp.einsum("etf,efd->etd", h_ETF, w.down_EFD),
                   per_expert)
  return jnp.einsum("etd,te->td", y_ETD, combine_TE)


def grouped_experts(x_YD, expert_Y, sizes_E, w: ExpertWeights) -> jax.Array:
  """Rows sorted by expert (`sizes_E[e]` rows of expert e, in order, then
  any padding rows) through their experts' MLPs (grouped matmuls,
  `maxtext.kernels.gmm`: megablox on TPU, `ragged_dot` elsewhere)."""
  h_YF = w.hidden(gmm.grouped_matmul(x_YD, w.gate_EDF, sizes_E),
                  gmm.grouped_matmul(x_YD, w.up_EDF, sizes_E), expert_Y)
  return w.output(gmm.grouped_matmul(h_YF, w.down_EFD, sizes_E), expert_Y)


def _sort_by_expert(routing: Routing, num_experts: int):
  """(order, expert_Y, sizes_E): the T*A assignments sorted by expert."""
  flat_experts = routing.experts_TA.reshape(-1)
  order = jnp.argsort(flat_experts, stable=True)
  return (order, flat_experts[order],
          expert_counts(flat_experts, num_experts))


def _inputs(x_TD, routing: Routing, order) -> jax.Array:
  """The rows [Y, D] of the assignments `order` (indices into the flat
  [T * k] choices): each its token's row, times its weight when the weights
  scale the inputs (`Routing.on_input`)."""
  k = routing.experts_TA.shape[1]
  x_YD = x_TD[order // k]
  if routing.on_input:
    x_YD = x_YD * routing.weights_TA.reshape(-1)[order].astype(
        x_YD.dtype)[:, None]
  return x_YD


def _weighted(y_YD, routing: Routing, order) -> jax.Array:
  """The outputs of the assignments `order`, times their weights unless
  those scaled the inputs."""
  if routing.on_input:
    return y_YD
  return y_YD * routing.weights_TA.reshape(-1)[order].astype(
      y_YD.dtype)[:, None]


def _combine(y_YD, routing: Routing, order, tokens: int) -> jax.Array:
  """Each token's sum of its sorted assignments' (weighted) outputs."""
  k = routing.experts_TA.shape[1]
  return jnp.zeros((tokens, y_YD.shape[-1]), y_YD.dtype).at[order // k].add(
      _weighted(y_YD, routing, order))


def dropless_experts(x_TD, routing: Routing, w: ExpertWeights) -> jax.Array:
  """Tokens sorted by expert through grouped matmuls (`ragged_dot`)."""
  order, expert_Y, sizes_E = _sort_by_expert(routing, w.gate_EDF.shape[0])
  y_YD = grouped_experts(_inputs(x_TD, routing, order), expert_Y, sizes_E, w)
  return _combine(y_YD, routing, order, x_TD.shape[0])


def sharded_dropless(x_TD, routing: Routing, w: ExpertWeights,
                     exchange: str = "auto", chunks: int = 1) -> jax.Array:
  """`dropless_experts` as the active compute rules split the experts and
  tokens: `expert_parallel_dropless` (with `exchange` and `chunks`),
  `token_parallel_dropless`, or on the whole batch."""
  tokens = x_TD.shape[0]
  rules = expert_parallel_rules(w.gate_EDF.shape[0], tokens)
  if rules is not None:
    return expert_parallel_dropless(x_TD, routing, w, rules, exchange,
                                    chunks)
  token_rules = token_parallel_rules(w, tokens)
  if token_rules is not None:
    return token_parallel_dropless(x_TD, routing, w, token_rules)
  return dropless_experts(x_TD, routing, w)


def expert_parallel_rules(num_experts: int, tokens: int):
  """The active compute rules when they split the experts, and the batch's
  `tokens`, over the `expert` mesh axis (size > 1), else None."""
  rules = axes.current_constrainer()
  mesh = getattr(rules, "mesh", None)
  if mesh is None or mesh.shape[EXPERT_AXIS] == 1:
    return None
  if rules.compute_spec((EXPERTS,), (num_experts,)) != (
      jax.sharding.PartitionSpec(EXPERT_AXIS)):
    return None
  token_axes, = axes.spec_axes(
      rules.compute_spec((axes.BATCH,), (tokens,)), 1)
  return rules if EXPERT_AXIS in token_axes else None


def token_parallel_rules(w: "ExpertWeights", tokens: int):
  """The active compute rules when they split the batch's `tokens` over
  some mesh axis and keep every expert weight whole, else None."""
  rules = axes.current_constrainer()
  mesh = getattr(rules, "mesh", None)
  if mesh is None:
    return None

  def splits(names, shape) -> bool:
    return any(mesh.shape[axis] > 1 for dim in axes.spec_axes(
        rules.compute_spec(names, shape), len(shape)) for axis in dim)

  weights = ((w.gate_EDF, (EXPERTS, axes.EMBED, axes.MLP)),
             (w.up_EDF, (EXPERTS, axes.EMBED, axes.MLP)),
             (w.down_EFD, (EXPERTS, axes.MLP, axes.EMBED)))
  if splits((axes.BATCH,), (tokens,)) and not any(
      splits(names, array.shape) for array, names in weights):
    return rules
  return None


def token_parallel_dropless(x_TD, routing: Routing, w: ExpertWeights,
                            rules) -> jax.Array:
  """`dropless_experts` on each shard's own tokens (module doc), under
  `jax.shard_map` over `rules.mesh`: tokens and their routing split as the
  compute rules split the batch, every expert weight whole on every
  shard."""
  tokens_spec = rules.compute_spec((axes.BATCH, None), x_TD.shape)
  arrays = {name: value for name, value in vars(w).items()
            if isinstance(value, jax.Array)}

  def local(x_TD, experts_TA, weights_TA, arrays):
    return dropless_experts(
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
  """`dropless_experts` with tokens moved between expert shards.

  Under `jax.shard_map` over `rules.mesh`: tokens (and their routing) split
  as the compute rules split the batch, expert weights by the `expert`
  axis. `exchange` (`maxtext.layers.moe.EXCHANGES`):
    "all_to_all": each shard sorts its assignments by expert, sends each
      to the shard holding its expert, runs its local experts on what it
      received (`grouped_experts`) and sends the results back (module
      doc). Fixed buffers: `expert` x the assignments move and are
      multiplied.
    "all_gather": each shard gathers the tokens of its `expert` group, runs
      its local experts on every one of them (`dense_experts`, weighted by
      the routing, zero where a token did not choose the expert) and
      reduce-scatters the sums back to the tokens' shards. Moves the tokens
      instead of `k` times their assignments and multiplies `local` rows
      per token instead of `k`. `chunks` > 1: the gathered tokens in that
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
    return dense_experts(x_TD, Routing(weights_TA, experts_TA, None,
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
  order, expert_Y, sizes_E = _sort_by_expert(routing, local * shards)
  # Send: shard p's rows (of its experts) go to buffer row p, from slot 0.
  dest_Y = expert_Y // local
  send_W = sizes_E.reshape(shards, local).sum(1)
  slot_Y = jnp.arange(rows) - (jnp.cumsum(send_W) - send_W)[dest_Y]
  send_WYD = jnp.zeros((shards, rows, x_TD.shape[-1]), x_TD.dtype).at[
      dest_Y, slot_Y].set(_inputs(x_TD, routing, order))
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
  y_JD = grouped_experts(
      recv_WYD.reshape(shards * rows, -1)[recv_order],
      jnp.minimum(expert_J[recv_order], local - 1), recv_sizes_WX.sum(0), w)
  y_WYD = jnp.zeros_like(y_JD).at[recv_order].set(y_JD).reshape(
      shards, rows, -1)
  back_WYD = jax.lax.all_to_all(y_WYD, EXPERT_AXIS, 0, 0)
  return _combine(back_WYD[dest_Y, slot_Y], routing, order, tokens)


def capacity_experts(x_TD, routing: Routing, w: ExpertWeights,
                     slots: int) -> tuple[jax.Array, jax.Array]:
  """Fixed-capacity dispatch; returns (y_TD, number of dropped assignments).

  Assignments fill their expert's `slots` in token order (a token's k
  choices in rank order); later ones are dropped.
  """
  tokens, k = routing.experts_TA.shape
  num_experts = w.gate_EDF.shape[0]
  flat_experts = routing.experts_TA.reshape(-1)
  one_hot_YE = jax.nn.one_hot(flat_experts, num_experts, dtype=jnp.int32)
  slot_Y = jnp.sum((jnp.cumsum(one_hot_YE, axis=0) - 1) * one_hot_YE, -1)
  kept_Y = slot_Y < slots
  # Dropped assignments write out of bounds (dropped) and read zeros.
  slot_Y = jnp.where(kept_Y, slot_Y, slots)
  assignments = jnp.arange(tokens * k)
  token_of = assignments // k
  x_ECD = jnp.zeros((num_experts, slots, x_TD.shape[-1]), x_TD.dtype).at[
      flat_experts, slot_Y].set(_inputs(x_TD, routing, assignments),
                                mode="drop")
  x_ECD = axes.constrain(x_ECD, _DISPATCHED)
  per_expert = (slice(None), None)  # Biases [E, 1, F or D].
  h_ECF = w.hidden(jnp.einsum("ecd,edf->ecf", x_ECD, w.gate_EDF),
                   jnp.einsum("ecd,edf->ecf", x_ECD, w.up_EDF), per_expert)
  y_ECD = axes.constrain(
      w.output(jnp.einsum("ecf,efd->ecd", h_ECF, w.down_EFD), per_expert),
      _DISPATCHED)
  y_YD = y_ECD.at[flat_experts, slot_Y].get(mode="fill", fill_value=0)
  y_TD = jnp.zeros_like(x_TD, dtype=y_YD.dtype).at[token_of].add(
      _weighted(y_YD, routing, assignments))
  return y_TD, jnp.sum(~kept_Y)


def load_balance_loss(routing: Routing, num_experts: int,
                      counts_E: jax.Array | None = None) -> jax.Array:
  """`E * sum_e (count_e / T) * mean_t probs[t, e]` (float32); `counts_E`:
  `expert_counts` of the routing when the caller has them."""
  tokens = routing.probs_TE.shape[0]
  if counts_E is None:
    counts_E = expert_counts(routing.experts_TA, num_experts)
  fraction_E = counts_E / tokens
  return num_experts * jnp.sum(fraction_E * routing.probs_TE.mean(0))


def router_z_loss(logits_TE: jax.Array) -> jax.Array:
  """Mean over tokens of logsumexp(router logits)^2 (float32)."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(
      logits_TE.astype(jnp.float32), axis=-1)))
