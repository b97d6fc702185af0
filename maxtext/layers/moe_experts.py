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
runs only its experts. The dropless path moves tokens itself, in
`maxtext.layers.moe_parallel`.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses

import jax
import jax.numpy as jnp

from maxtext.common import axes
from maxtext.kernels import gmm

# Logical axis of the expert dimension of expert weights and of tokens
# dispatched to experts.
EXPERTS = "experts"
_DISPATCHED = (EXPERTS, None, axes.EMBED)


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


def sort_by_expert(routing: Routing, num_experts: int):
  """(order, expert_Y, sizes_E): the T*A assignments sorted by expert."""
  flat_experts = routing.experts_TA.reshape(-1)
  order = jnp.argsort(flat_experts, stable=True)
  return (order, flat_experts[order],
          expert_counts(flat_experts, num_experts))


def assignment_inputs(x_TD, routing: Routing, order) -> jax.Array:
  """The rows [Y, D] of the assignments `order` (indices into the flat
  [T * k] choices): each its token's row, times its weight when the weights
  scale the inputs (`Routing.on_input`)."""
  k = routing.experts_TA.shape[1]
  x_YD = x_TD[order // k]
  if routing.on_input:
    x_YD = x_YD * routing.weights_TA.reshape(-1)[order].astype(
        x_YD.dtype)[:, None]
  return x_YD


def weighted_outputs(y_YD, routing: Routing, order) -> jax.Array:
  """The outputs of the assignments `order`, times their weights unless
  those scaled the inputs."""
  if routing.on_input:
    return y_YD
  return y_YD * routing.weights_TA.reshape(-1)[order].astype(
      y_YD.dtype)[:, None]


def combine_outputs(y_YD, routing: Routing, order, tokens: int) -> jax.Array:
  """Each token's sum of its sorted assignments' (weighted) outputs."""
  k = routing.experts_TA.shape[1]
  return jnp.zeros((tokens, y_YD.shape[-1]), y_YD.dtype).at[order // k].add(
      weighted_outputs(y_YD, routing, order))


def dropless_experts(x_TD, routing: Routing, w: ExpertWeights) -> jax.Array:
  """Tokens sorted by expert through grouped matmuls (`ragged_dot`)."""
  order, expert_Y, sizes_E = sort_by_expert(routing, w.gate_EDF.shape[0])
  y_YD = grouped_experts(assignment_inputs(x_TD, routing, order), expert_Y,
                         sizes_E, w)
  return combine_outputs(y_YD, routing, order, x_TD.shape[0])


def routed_experts(x_TD, routing: Routing, w: ExpertWeights,
                   first_expert=0) -> jax.Array:
  """`dense_experts`' result from only the assignments to `w`'s experts
  (numbered `first_expert` on), sorted by expert into T * min(k, local)
  rows (a token takes an expert once; the other assignments after them)
  and run through grouped matmuls, which skip the rows past the groups
  where `gmm.skips_unused_rows`."""
  tokens, k = routing.experts_TA.shape
  local = w.gate_EDF.shape[0]
  local_TA = routing.experts_TA - first_expert
  # Assignments to other experts sort last, as expert `local`.
  order, expert_Y, sizes_E = sort_by_expert(dataclasses.replace(
      routing, experts_TA=jnp.where((local_TA >= 0) & (local_TA < local),
                                    local_TA, local)), local + 1)
  rows = tokens * min(k, local)
  order, expert_Y = order[:rows], expert_Y[:rows]
  y_YD = grouped_experts(assignment_inputs(x_TD, routing, order),
                         jnp.minimum(expert_Y, local - 1), sizes_E[:local],
                         w)
  mine_Y1 = (expert_Y < local)[:, None]
  return combine_outputs(jnp.where(mine_Y1, y_YD, 0), routing, order, tokens)


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
      flat_experts, slot_Y].set(
          assignment_inputs(x_TD, routing, assignments), mode="drop")
  x_ECD = axes.constrain(x_ECD, _DISPATCHED)
  per_expert = (slice(None), None)  # Biases [E, 1, F or D].
  h_ECF = w.hidden(jnp.einsum("ecd,edf->ecf", x_ECD, w.gate_EDF),
                   jnp.einsum("ecd,edf->ecf", x_ECD, w.up_EDF), per_expert)
  y_ECD = axes.constrain(
      w.output(jnp.einsum("ecf,efd->ecd", h_ECF, w.down_EFD), per_expert),
      _DISPATCHED)
  y_YD = y_ECD.at[flat_experts, slot_Y].get(mode="fill", fill_value=0)
  y_TD = jnp.zeros_like(x_TD, dtype=y_YD.dtype).at[token_of].add(
      weighted_outputs(y_YD, routing, assignments))
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
