"""Mixture of experts: a router, routed experts and optional shared experts.

Routing (`route`): router logits [T, E] become scores, by softmax over the
experts (Mixtral, Qwen 3 MoE) or per-expert sigmoid (DeepSeek-V3). A token
picks its top-k experts by score (plus, with `router_bias`, a per-expert bias
that only steers the choice; with expert groups, only among the experts of
its best groups); its weights are the chosen scores, optionally divided by
their sum, times `routed_scaling_factor`.

Three ways to run the routed experts, equal whenever nothing is dropped:
  "dropless": the T*k (token, expert) assignments are sorted by expert and
    each expert's contiguous run goes through a grouped matmul
    (`jax.lax.ragged_dot`); no token is ever dropped.
  "capacity": each expert has C = ceil(capacity_factor * T * k / E) slots,
    filled in token order; assignments past C are dropped (their weight is
    lost) and counted. Fixed shapes [E, C, D].
  "dense": every expert runs on every token and the outputs are combined
    with one-hot weights; the reference.

Auxiliary losses (`MoE.__call__` returns them with the output, already
weighted by the config): the load-balancing loss
`E * sum_e f_e * p_e` with f_e the number of assignments to expert e divided
by T and p_e the mean router probability of e (Switch Transformer, as
Mixtral's `load_balancing_loss_func`; k when perfectly balanced), and the
router z-loss mean(logsumexp(logits)^2). Decoder models sow their layers'
sum as an `AuxLoss` intermediate; the train step adds it to the objective.

DeepSeek's auxiliary-loss-free balancing moves the selection bias against
each expert's load (`update_router_bias`; the train step does not call it
yet, so the bias stays at its loaded value).

Expert parallelism: expert weights carry the logical axis "experts" (the
rule tables map it to the `expert` mesh axis). The capacity path constrains
its dispatched tokens [E, C, D] to the same axis, so XLA exchanges tokens
between the batch shards and the expert shards (all-to-all) and each device
runs only its experts; the dropless path lets XLA gather the expert weights
(sharded ragged_dot is not partitioned over experts).

Shape key: B batch, L length, D embed dim, T tokens (B*L), E experts,
K experts per token, S token-expert assignments (T*K), F expert hidden dim,
C expert capacity.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.layers import linear
from maxtext.layers import mlp

# Logical axis of the expert dimension of expert weights and of tokens
# dispatched to experts.
EXPERTS = "experts"
_DISPATCHED = (EXPERTS, None, axes.EMBED)


class AuxLoss(nnx.Intermediate):
  """A scalar a model adds to its training objective (sown by the model)."""


class RouterBias(nnx.Variable):
  """DeepSeek's expert-selection bias: not a `nnx.Param` (no gradient)."""


@dataclasses.dataclass(frozen=True)
class Routing:
  """A router's decision for T tokens.

  Attributes:
    weights_TK: Weight of each chosen expert in the token's output.
    experts_TK: The chosen experts (int32).
    probs_TE: Router probabilities (scores normalised over the experts),
      for the load-balancing loss.
  """

  weights_TK: jax.Array
  experts_TK: jax.Array
  probs_TE: jax.Array


def route(logits_TE: jax.Array, cfg: ModelConfig,
          bias_E: jax.Array | None = None) -> Routing:
  """Chooses `cfg.num_experts_per_token` experts per token (module doc)."""
  logits_TE = logits_TE.astype(jnp.float32)
  if cfg.router_score == "softmax":
    scores_TE = jax.nn.softmax(logits_TE, axis=-1)
  else:
    scores_TE = jax.nn.sigmoid(logits_TE)
  choice_TE = scores_TE if bias_E is None else scores_TE + bias_E
  groups = cfg.num_expert_groups
  if groups > 1:
    tokens, experts = choice_TE.shape
    grouped = choice_TE.reshape(tokens, groups, experts // groups)
    group_score = jax.lax.top_k(grouped, min(2, experts // groups))[0].sum(-1)
    _, best_groups = jax.lax.top_k(group_score, cfg.expert_groups_per_token)
    keep = jnp.zeros((tokens, groups), bool).at[
        jnp.arange(tokens)[:, None], best_groups].set(True)
    # Experts of other groups score 0, as in DeepSeek-V3's reference code.
    choice_TE = jnp.where(keep[:, :, None], grouped, 0.0).reshape(
        tokens, experts)
  _, experts_TK = jax.lax.top_k(choice_TE, cfg.num_experts_per_token)
  weights_TK = jnp.take_along_axis(scores_TE, experts_TK, axis=-1)
  if cfg.router_normalize:
    weights_TK = weights_TK / (weights_TK.sum(-1, keepdims=True) + 1e-20)
  probs_TE = scores_TE
  if cfg.router_score == "sigmoid":
    probs_TE = scores_TE / scores_TE.sum(-1, keepdims=True)
  return Routing(weights_TK * cfg.routed_scaling_factor,
                 experts_TK.astype(jnp.int32), probs_TE)


def expert_counts(experts_TK: jax.Array, num_experts: int) -> jax.Array:
  """Assignments per expert [E] (int32)."""
  return jnp.bincount(experts_TK.reshape(-1), length=num_experts).astype(
      jnp.int32)


def load_balance_loss(routing: Routing, num_experts: int) -> jax.Array:
  """`E * sum_e (count_e / T) * mean_t probs[t, e]` (float32)."""
  tokens = routing.probs_TE.shape[0]
  fraction_E = expert_counts(routing.experts_TK, num_experts) / tokens
  return num_experts * jnp.sum(fraction_E * routing.probs_TE.mean(0))


def router_z_loss(logits_TE: jax.Array) -> jax.Array:
  """Mean over tokens of logsumexp(router logits)^2 (float32)."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(
      logits_TE.astype(jnp.float32), axis=-1)))


def update_router_bias(bias_E: jax.Array, experts_TK: jax.Array,
                       rate: float) -> jax.Array:
  """DeepSeek's auxiliary-loss-free balancing step.

  Each expert's bias moves by `rate` towards balance: down when it got more
  than the mean number of assignments, up when fewer, unchanged when equal.
  """
  counts_E = expert_counts(experts_TK, bias_E.shape[0]).astype(jnp.float32)
  return bias_E + rate * jnp.sign(counts_E.mean() - counts_E).astype(
      bias_E.dtype)


@dataclasses.dataclass(frozen=True)
class ExpertWeights:
  """The routed experts' gated MLPs, in the compute dtype.

  Attributes:
    gate_EDF: Gate projections.
    up_EDF: Up projections.
    down_EFD: Down projections.
    activation: Gate activation (`maxtext.layers.mlp.ACTIVATIONS`).
  """

  gate_EDF: jax.Array
  up_EDF: jax.Array
  down_EFD: jax.Array
  activation: object


def dense_experts(x_TD, routing: Routing, w: ExpertWeights) -> jax.Array:
  """Reference: every expert on every token, one-hot combine."""
  combine_TE = jnp.zeros(routing.probs_TE.shape, x_TD.dtype).at[
      jnp.arange(x_TD.shape[0])[:, None], routing.experts_TK].add(
          routing.weights_TK.astype(x_TD.dtype))
  h_TEF = (w.activation(jnp.einsum("td,edf->tef", x_TD, w.gate_EDF))
           * jnp.einsum("td,edf->tef", x_TD, w.up_EDF))
  y_TED = jnp.einsum("tef,efd->ted", h_TEF, w.down_EFD)
  return jnp.einsum("ted,te->td", y_TED, combine_TE)


def dropless_experts(x_TD, routing: Routing, w: ExpertWeights) -> jax.Array:
  """Tokens sorted by expert through grouped matmuls (`ragged_dot`)."""
  tokens, k = routing.experts_TK.shape
  flat_experts = routing.experts_TK.reshape(-1)
  order = jnp.argsort(flat_experts, stable=True)
  token_of = order // k
  sizes_E = expert_counts(flat_experts, w.gate_EDF.shape[0])
  x_SD = x_TD[token_of]
  h_SF = (w.activation(jax.lax.ragged_dot(x_SD, w.gate_EDF, sizes_E))
          * jax.lax.ragged_dot(x_SD, w.up_EDF, sizes_E))
  y_SD = jax.lax.ragged_dot(h_SF, w.down_EFD, sizes_E)
  weights_S = routing.weights_TK.reshape(-1)[order].astype(y_SD.dtype)
  return jnp.zeros((tokens, y_SD.shape[-1]), y_SD.dtype).at[token_of].add(
      y_SD * weights_S[:, None])


def capacity(tokens: int, cfg: ModelConfig) -> int:
  """Slots per expert of the capacity path."""
  return math.ceil(cfg.capacity_factor * tokens * cfg.num_experts_per_token
                   / cfg.num_experts)


def capacity_experts(x_TD, routing: Routing, w: ExpertWeights,
                     slots: int) -> tuple[jax.Array, jax.Array]:
  """Fixed-capacity dispatch; returns (y_TD, number of dropped assignments).

  Assignments fill their expert's `slots` in token order (a token's k
  choices in rank order); later ones are dropped.
  """
  tokens, k = routing.experts_TK.shape
  num_experts = w.gate_EDF.shape[0]
  flat_experts = routing.experts_TK.reshape(-1)
  one_hot_SE = jax.nn.one_hot(flat_experts, num_experts, dtype=jnp.int32)
  slot_S = jnp.sum((jnp.cumsum(one_hot_SE, axis=0) - 1) * one_hot_SE, -1)
  kept_S = slot_S < slots
  # Dropped assignments write out of bounds (dropped) and read zeros.
  slot_S = jnp.where(kept_S, slot_S, slots)
  token_of = jnp.arange(tokens * k) // k
  x_ECD = jnp.zeros((num_experts, slots, x_TD.shape[-1]), x_TD.dtype).at[
      flat_experts, slot_S].set(x_TD[token_of], mode="drop")
  x_ECD = axes.constrain(x_ECD, _DISPATCHED)
  h_ECF = (w.activation(jnp.einsum("ecd,edf->ecf", x_ECD, w.gate_EDF))
           * jnp.einsum("ecd,edf->ecf", x_ECD, w.up_EDF))
  y_ECD = axes.constrain(jnp.einsum("ecf,efd->ecd", h_ECF, w.down_EFD),
                         _DISPATCHED)
  y_SD = y_ECD.at[flat_experts, slot_S].get(mode="fill", fill_value=0)
  weights_S = routing.weights_TK.reshape(-1).astype(y_SD.dtype)
  y_TD = jnp.zeros_like(x_TD, dtype=y_SD.dtype).at[token_of].add(
      y_SD * weights_S[:, None])
  return y_TD, jnp.sum(~kept_S)


class MoE(nnx.Module):
  """Routed experts (+ shared experts): [B, L, D] -> ([B, L, D], aux).

  `aux` holds float32 scalars: "loss" (the weighted auxiliary losses of
  this layer, added to the objective), "load_balance_loss" and
  "router_z_loss" (unweighted) and "dropped_fraction" (of the token-expert
  assignments, 0 unless moe_impl="capacity").
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    experts, dim, hidden = cfg.num_experts, cfg.embed_dim, cfg.moe_mlp_dim
    self.router = linear.Linear(
        (dim,), (experts,), in_axes=(axes.EMBED,), out_axes=(EXPERTS,),
        dtype="float32", param_dtype=cfg.param_dtype, rngs=rngs)
    init = nnx.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=2,
        batch_axis=(0,))
    param_dtype = jnp.dtype(cfg.param_dtype)
    self.gate = axes.param(
        init(rngs.params(), (experts, dim, hidden), param_dtype),
        (EXPERTS, axes.EMBED, axes.MLP))
    self.up = axes.param(
        init(rngs.params(), (experts, dim, hidden), param_dtype),
        (EXPERTS, axes.EMBED, axes.MLP))
    self.down = axes.param(
        init(rngs.params(), (experts, hidden, dim), param_dtype),
        (EXPERTS, axes.MLP, axes.EMBED))
    self.router_bias = (RouterBias(jnp.zeros((experts,), jnp.float32))
                        if cfg.router_bias else None)
    if cfg.num_shared_experts:
      self.shared = mlp.MLP(dataclasses.replace(
          cfg, mlp_dim=cfg.num_shared_experts * hidden), rngs=rngs)
    else:
      self.shared = None

  def __call__(self, x_BLD: jax.Array) -> tuple[jax.Array, dict]:
    cfg = self.cfg
    batch, length, dim = x_BLD.shape
    dtype = jnp.dtype(cfg.dtype)
    x_TD = x_BLD.reshape(batch * length, dim).astype(dtype)
    logits_TE = self.router(x_TD)
    bias_E = None if self.router_bias is None else self.router_bias[...]
    routing = route(logits_TE, cfg, bias_E)
    weights = ExpertWeights(
        self.gate[...].astype(dtype), self.up[...].astype(dtype),
        self.down[...].astype(dtype), mlp.ACTIVATIONS[cfg.mlp_activation])
    dropped = jnp.zeros((), jnp.int32)
    if cfg.moe_impl == "dropless":
      y_TD = dropless_experts(x_TD, routing, weights)
    elif cfg.moe_impl == "capacity":
      y_TD, dropped = capacity_experts(x_TD, routing, weights,
                                       capacity(x_TD.shape[0], cfg))
    else:
      y_TD = dense_experts(x_TD, routing, weights)
    y_BLD = y_TD.reshape(batch, length, dim)
    if self.shared is not None:
      y_BLD = y_BLD + self.shared(x_BLD)
    balance = load_balance_loss(routing, cfg.num_experts)
    z_loss = router_z_loss(logits_TE)
    aux = {
        "loss": (cfg.load_balance_loss_weight * balance
                 + cfg.router_z_loss_weight * z_loss),
        "load_balance_loss": balance,
        "router_z_loss": z_loss,
        "dropped_fraction": dropped / routing.experts_TK.size,
    }
    return y_BLD.astype(x_BLD.dtype), aux
