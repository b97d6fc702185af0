"""Mixture of experts: a router, routed experts and optional shared experts.

Routing (`route`): router logits [T, E] become scores, by softmax over the
experts (Mixtral, Qwen 3 MoE) or per-expert sigmoid (DeepSeek-V3). A token
picks its top-k experts by score (plus, with `router_bias`, a per-expert bias
that only steers the choice; with expert groups, only among the experts of
its best groups); its weights are the chosen scores, optionally divided by
their sum, times `routed_scaling_factor`. GPT-OSS's router (a softmax over
the top-k logits) is softmax scores renormalised over the chosen experts,
with `router_logit_bias` adding a trained bias to the logits.

The routed experts (gated MLPs), the three ways to run them
(`cfg.moe_impl`: "dropless", "capacity", "dense") and expert parallelism
are in `maxtext.layers.moe_experts`.

Auxiliary losses (`MoE.__call__` returns them with the output, already
weighted by the config): the load-balancing loss
`E * sum_e f_e * p_e` with f_e the number of assignments to expert e divided
by T and p_e the mean router probability of e (Switch Transformer, as
Mixtral's `load_balancing_loss_func`; k when perfectly balanced), and the
router z-loss mean(logsumexp(logits)^2). Decoder models sow their layers'
sum as an `AuxLoss` intermediate; the train step collects it with
`nnx.capture` and adds it to the objective.

DeepSeek's auxiliary-loss-free balancing moves the selection bias against
each expert's load (`update_router_bias`): the layer reports its experts'
loads, the decoder sows them and the train step moves the bias after each
update by `cfg.router_bias_update_rate` (`Decoder.update_router_bias`). The
bias is a `RouterBias` variable, not a `nnx.Param`: it lives in the train
state's `model_state`, out of reach of the gradients, the optimizer and
its weight decay.

Shape key: B batch, L length, D embed dim, T tokens (B*L), E experts,
K experts per token, F expert hidden dim.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.layers import linear
from maxtext.layers import mlp
from maxtext.layers import moe_experts


class AuxLoss(nnx.Intermediate):
  """A scalar a model adds to its training objective (sown by the model)."""


class RouterBias(nnx.Variable):
  """DeepSeek's expert-selection bias: not a `nnx.Param` (no gradient)."""


def route(logits_TE: jax.Array, cfg: ModelConfig,
          bias_E: jax.Array | None = None) -> moe_experts.Routing:
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
  return moe_experts.Routing(weights_TK * cfg.routed_scaling_factor,
                             experts_TK.astype(jnp.int32), probs_TE)


def load_balance_loss(routing: moe_experts.Routing, num_experts: int,
                      counts_E: jax.Array | None = None) -> jax.Array:
  """`E * sum_e (count_e / T) * mean_t probs[t, e]` (float32); `counts_E`:
  `moe_experts.expert_counts` of the routing when the caller has them."""
  tokens = routing.probs_TE.shape[0]
  if counts_E is None:
    counts_E = moe_experts.expert_counts(routing.experts_TK, num_experts)
  fraction_E = counts_E / tokens
  return num_experts * jnp.sum(fraction_E * routing.probs_TE.mean(0))


def router_z_loss(logits_TE: jax.Array) -> jax.Array:
  """Mean over tokens of logsumexp(router logits)^2 (float32)."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(
      logits_TE.astype(jnp.float32), axis=-1)))


def load_imbalance(load_NE: jax.Array) -> jax.Array:
  """Max over mean of the experts' loads [..., E], averaged over the rest.

  1 when perfectly balanced, E / k when every token picks the same experts.
  """
  load_NE = load_NE.astype(jnp.float32)
  return jnp.mean(load_NE.max(-1) / jnp.maximum(load_NE.mean(-1), 1e-20))


def update_router_bias(bias_E: jax.Array, load_E: jax.Array,
                       rate: float) -> jax.Array:
  """DeepSeek's auxiliary-loss-free balancing step.

  Each expert's bias moves by `rate` towards balance: down when its load
  (assignments, any scale) is above the mean load, up when below,
  unchanged when equal. Leading axes (e.g. layers) are batched over.
  """
  load_E = load_E.astype(jnp.float32)
  mean = load_E.mean(-1, keepdims=True)
  return bias_E + rate * jnp.sign(mean - load_E).astype(bias_E.dtype)


class MoE(nnx.Module):
  """Routed experts (+ shared experts): [B, L, D] -> ([B, L, D], aux).

  `aux` holds float32 scalars: "loss" (the weighted auxiliary losses of
  this layer, added to the objective), "load_balance_loss" and
  "router_z_loss" (unweighted) and "dropped_fraction" (of the token-expert
  assignments, 0 unless moe_impl="capacity"); and "expert_load" [E], the
  assignments routed to each expert (before any drop).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    experts, dim, hidden = cfg.num_experts, cfg.embed_dim, cfg.moe_mlp_dim
    self.router = linear.Linear(
        (dim,), (experts,), in_axes=(axes.EMBED,),
        out_axes=(moe_experts.EXPERTS,),
        dtype="float32", param_dtype=cfg.param_dtype, rngs=rngs,
        use_bias=cfg.router_logit_bias)
    init = nnx.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=2,
        batch_axis=(0,))
    param_dtype = jnp.dtype(cfg.param_dtype)
    if cfg.expert_gate_up_fused:
      fused_init = nnx.initializers.variance_scaling(
          1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=(2, 3),
          batch_axis=(0,))
      self.gate_up = axes.param(
          fused_init(rngs.params(), (experts, dim, 2, hidden), param_dtype),
          (moe_experts.EXPERTS, axes.EMBED, None, axes.MLP))
      self.gate = self.up = None
    else:
      self.gate_up = None
      self.gate = axes.param(
          init(rngs.params(), (experts, dim, hidden), param_dtype),
          (moe_experts.EXPERTS, axes.EMBED, axes.MLP))
      self.up = axes.param(
          init(rngs.params(), (experts, dim, hidden), param_dtype),
          (moe_experts.EXPERTS, axes.EMBED, axes.MLP))
    if cfg.expert_bias:
      self.gate_up_bias = axes.param(
          jnp.zeros((experts, 2, hidden), param_dtype),
          (moe_experts.EXPERTS, None, axes.MLP))
      self.down_bias = axes.param(jnp.zeros((experts, dim), param_dtype),
                                  (moe_experts.EXPERTS, axes.EMBED))
    else:
      self.gate_up_bias = self.down_bias = None
    self.down = axes.param(
        init(rngs.params(), (experts, hidden, dim), param_dtype),
        (moe_experts.EXPERTS, axes.MLP, axes.EMBED))
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
    if self.gate_up is None:
      gate_EDF, up_EDF = self.gate[...], self.up[...]
    else:
      gate_EDF, up_EDF = self.gate_up[:, :, 0], self.gate_up[:, :, 1]
    biases = [None if b is None else b[...].astype(dtype)
              for b in (self.gate_up_bias, self.down_bias)]
    weights = moe_experts.ExpertWeights(
        gate_EDF.astype(dtype), up_EDF.astype(dtype),
        self.down[...].astype(dtype), mlp.GATED_UNITS[cfg.mlp_activation],
        *biases)
    dropped = jnp.zeros((), jnp.int32)
    if cfg.moe_impl == "dropless":
      rules = moe_experts.expert_parallel_rules(cfg.num_experts,
                                                x_TD.shape[0])
      if rules is None:
        y_TD = moe_experts.dropless_experts(x_TD, routing, weights)
      else:
        y_TD = moe_experts.expert_parallel_dropless(x_TD, routing, weights,
                                                    rules)
    elif cfg.moe_impl == "capacity":
      y_TD, dropped = moe_experts.capacity_experts(
          x_TD, routing, weights, moe_experts.capacity(x_TD.shape[0], cfg))
    else:
      y_TD = moe_experts.dense_experts(x_TD, routing, weights)
    y_BLD = y_TD.reshape(batch, length, dim)
    if self.shared is not None:
      y_BLD = y_BLD + self.shared(x_BLD)
    load_E = moe_experts.expert_counts(routing.experts_TK, cfg.num_experts)
    balance = load_balance_loss(routing, cfg.num_experts, load_E)
    z_loss = router_z_loss(logits_TE)
    aux = {
        "loss": (cfg.load_balance_loss_weight * balance
                 + cfg.router_z_loss_weight * z_loss),
        "load_balance_loss": balance,
        "router_z_loss": z_loss,
        "dropped_fraction": dropped / routing.experts_TK.size,
        "expert_load": load_E.astype(jnp.float32),
    }
    return y_BLD.astype(x_BLD.dtype), aux
