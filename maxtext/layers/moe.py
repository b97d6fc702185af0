"""Mixture of experts: a router, routed experts and optional shared experts.

Routing (`route`): router logits [T, E] become scores, by softmax over the
experts (Mixtral, Qwen 3 MoE) or per-expert sigmoid (DeepSeek-V3). A token
picks its top-k experts by score (plus, with `router_bias`, a per-expert bias
that only steers the choice; with expert groups, only among the experts of
its best groups: a group scores the sum of its two best experts' scores,
DeepSeek-V3, or its best one, DeepSeek-V2); its weights are the chosen
scores, optionally divided by their sum, times `routed_scaling_factor`, and
scale the chosen experts' outputs (or, Llama 4, their inputs). GPT-OSS's
router (a softmax over the top-k logits) is softmax scores renormalised over
the chosen experts, with `router_logit_bias` adding a trained bias to the
logits; Llama 4's (a sigmoid of the top-k logits) is sigmoid scores, not
renormalised. Gemma 4's router normalises the residual stream itself
(`router_input_norm`) and scales each chosen weight by its expert's learned
scale (`router_per_expert_scale`).

The routed experts (gated MLPs) and the three ways to run them
(`MoeConfig.impl`: "dropless", "capacity", "dense") are in
`maxtext.layers.moe_experts`; the dropless path's token exchange on a
sharded batch is in `maxtext.layers.moe_parallel`.

Auxiliary losses (`MoE.__call__` returns them with the output, already
weighted by the config): the load-balancing loss (`moe_experts.load_balance_loss`)
`E * sum_e f_e * p_e` with f_e the number of assignments to expert e divided
by T and p_e the mean router probability of e (Switch Transformer, as
Mixtral's `load_balancing_loss_func`; k when perfectly balanced), and the
router z-loss mean(logsumexp(logits)^2). Decoder models sow their layers'
sum as an `AuxLoss` intermediate; the train step collects it with
`nnx.capture` and adds it to the objective.

DeepSeek's auxiliary-loss-free balancing moves the selection bias against
each expert's load (`update_router_bias`): the layer reports its experts'
loads, the decoder sows them and the train step moves the bias after each
update by `MoeConfig.router_bias_update_rate`
(`Decoder.update_router_bias`). The bias is a `RouterBias` variable, not a `nnx.Param`: it lives in the train
state's `model_state`, out of reach of the gradients, the optimizer and
its weight decay.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import sections
from maxtext.layers import linear
from maxtext.layers import mlp
from maxtext.layers import moe_experts
from maxtext.layers import moe_parallel
from maxtext.layers import norm


ROUTER_SCORES = ("softmax", "sigmoid")
# A group's score in group-limited routing: the sum of its two best experts'
# scores (DeepSeek-V3) or its best one's (DeepSeek-V2).
GROUP_SCORES = ("top2_sum", "max")
IMPLS = ("dropless", "capacity", "dense")
EXCHANGES = ("auto", "all_to_all", "all_gather")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeConfig:
  """A model's mixture of experts (`ModelConfig.moe`); which layers have
  experts is the layer pattern's (`maxtext.common.layer_pattern`).

  Attributes (their `model` section keys in `KEYS`):
    num_experts: Routed experts of each MoE layer; 0: a dense MLP in every
      layer.
    num_experts_per_token: Experts each token is sent to (top-k).
    mlp_dim: Hidden width of one expert (and of one shared expert).
    num_shared_experts: Experts every token also goes through, unweighted,
      as one MLP of width `num_shared_experts * mlp_dim` (DeepSeek).
    shared_mlp_dim: Width of that MLP when it is not `num_shared_experts *
      mlp_dim` (Qwen3-Next's shared_expert_intermediate_size); 0: that.
    shared_expert_gate: The shared experts' output is multiplied by
      sigmoid(x . w_gate), one learned [embed] vector (Qwen3-Next).
    router_score: "softmax" over the experts (Mixtral, Qwen 3 MoE) or
      per-expert "sigmoid" (DeepSeek-V3).
    router_normalize: The chosen experts' weights are divided by their sum.
    router_bias: A per-expert bias, added to the scores only to choose the
      experts (DeepSeek-V3's e_score_correction_bias); not trained by
      gradients but moved by `update_router_bias`.
    router_bias_update_rate: After each training update, each expert's
      `router_bias` moves by this much against its load of that step
      (DeepSeek-V3's auxiliary-loss-free balancing, their gamma = 0.001);
      0 is off. Needs router_bias.
    router_logit_bias: The router adds a trained per-expert bias to its
      logits (GPT-OSS); unlike router_bias it also changes the weights.
    expert_bias: The routed experts' gate, up and down projections add a
      per-expert bias (GPT-OSS).
    expert_gate_up_fused: The routed experts' gate and up projections are
      one parameter `gate_up` [experts, embed, 2, mlp_dim] (GPT-OSS
      checkpoints store them as one tensor) instead of `gate` and `up`.
    routed_scaling_factor: Multiplies the routed experts' weights.
    router_weights_on_input: A chosen expert's weight scales its input
      instead of its output (Llama 4: expert(w * x), not w * expert(x)).
    router_input_norm: The router reads the block's residual stream (not the
      experts' normalised input) through a weightless RMS norm times a
      learned scale [embed] and embed^-0.5 (Gemma 4).
    router_per_expert_scale: A chosen expert's weight is multiplied by a
      learned scale of that expert, after any renormalisation (Gemma 4).
    with_mlp: Layers with experts keep the dense MLP and run both on the
      same residual stream, each with its own norms, adding their outputs
      (Gemma 4 26b-a4b; `maxtext.models.block.Block`).
    num_expert_groups: Experts are split into this many groups; a token
      chooses experts only within its best `expert_groups_per_token` groups
      (scored by `expert_group_score`). 1 is off.
    expert_groups_per_token: Groups each token may choose experts from.
    expert_group_score: A group's score, of `GROUP_SCORES`: "top2_sum" (the
      sum of its two best experts' scores, DeepSeek-V3) or "max" (its best
      expert's, DeepSeek-V2).
    impl: "dropless" (tokens sorted by expert, grouped matmuls,
      `maxtext.kernels.gmm`), "capacity" (each expert takes at most
      `capacity_factor * tokens * num_experts_per_token / num_experts`
      tokens; the rest are dropped and counted) or "dense" (every expert
      runs on every token: the reference).
    capacity_factor: See impl="capacity".
    expert_exchange: How impl="dropless" moves tokens between expert
      shards, of `EXCHANGES` (`moe_parallel.expert_parallel_dropless`).
    expert_chunks: The "all_gather" exchange runs its gathered tokens
      through the shard's experts in this many chunks, each rematerialised:
      less memory, one more forward pass of the experts. 1 is off.
    load_balance_loss_weight: Weight of the auxiliary load-balancing loss
      (module doc); 0 is off.
    router_z_loss_weight: Weight of the router z-loss; 0 is off.
  """

  KEYS: ClassVar[dict[str, str]] = {
      "num_experts": "num_experts",
      "num_experts_per_token": "num_experts_per_token",
      "mlp_dim": "moe_mlp_dim", "num_shared_experts": "num_shared_experts",
      "shared_mlp_dim": "shared_expert_mlp_dim",
      "shared_expert_gate": "shared_expert_gate",
      "router_score": "router_score", "router_normalize": "router_normalize",
      "router_bias": "router_bias",
      "router_bias_update_rate": "router_bias_update_rate",
      "router_logit_bias": "router_logit_bias", "expert_bias": "expert_bias",
      "expert_gate_up_fused": "expert_gate_up_fused",
      "routed_scaling_factor": "routed_scaling_factor",
      "weights_on_input": "router_weights_on_input",
      "router_input_norm": "router_input_norm",
      "router_per_expert_scale": "router_per_expert_scale",
      "with_mlp": "moe_with_mlp",
      "num_expert_groups": "num_expert_groups",
      "expert_groups_per_token": "expert_groups_per_token",
      "expert_group_score": "expert_group_score",
      "impl": "moe_impl", "capacity_factor": "capacity_factor",
      "expert_exchange": "moe_expert_exchange",
      "expert_chunks": "moe_expert_chunks",
      "load_balance_loss_weight": "load_balance_loss_weight",
      "router_z_loss_weight": "router_z_loss_weight",
  }

  num_experts: int = 0
  num_experts_per_token: int = 1
  mlp_dim: int = 0
  num_shared_experts: int = 0
  shared_mlp_dim: int = 0
  shared_expert_gate: bool = False
  router_score: str = "softmax"
  router_normalize: bool = True
  router_bias: bool = False
  router_bias_update_rate: float = 0.0
  router_logit_bias: bool = False
  expert_bias: bool = False
  expert_gate_up_fused: bool = False
  routed_scaling_factor: float = 1.0
  weights_on_input: bool = False
  router_input_norm: bool = False
  router_per_expert_scale: bool = False
  with_mlp: bool = False
  num_expert_groups: int = 1
  expert_groups_per_token: int = 1
  expert_group_score: str = "top2_sum"
  impl: str = "dropless"
  capacity_factor: float = 1.25
  expert_exchange: str = "auto"
  expert_chunks: int = 1
  load_balance_loss_weight: float = 0.0
  router_z_loss_weight: float = 0.0

  def __post_init__(self):
    def fail(field, valid):
      sections.fail_part(self, field, valid)

    for name, least in (("num_experts", 0), ("num_shared_experts", 0),
                        ("mlp_dim", 0), ("shared_mlp_dim", 0),
                        ("expert_chunks", 1)):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, int)
          or value < least):
        fail(name, f"must be an integer >= {least}")
    expert_flags = ("router_logit_bias", "expert_bias",
                    "expert_gate_up_fused", "weights_on_input",
                    "router_input_norm", "router_per_expert_scale",
                    "with_mlp")
    for name in expert_flags + ("router_normalize", "router_bias",
                                "shared_expert_gate"):
      if not isinstance(getattr(self, name), bool):
        fail(name, "must be True or False")
    for name in ("shared_mlp_dim", "shared_expert_gate"):
      if getattr(self, name) and not self.num_shared_experts:
        fail(name, "needs num_shared_experts > 0 (shared experts to size)")
    if not self.num_experts:
      for name in ("num_shared_experts",) + expert_flags:
        if getattr(self, name):
          fail("num_experts", f"must be positive when {self.KEYS[name]} is"
               " set")
      return
    for name, valid in (("router_score", ROUTER_SCORES), ("impl", IMPLS),
                        ("expert_group_score", GROUP_SCORES),
                        ("expert_exchange", EXCHANGES)):
      if getattr(self, name) not in valid:
        fail(name, f"valid values are {valid}")
    if self.mlp_dim < 1:
      fail("mlp_dim", "must be positive when num_experts > 0")
    if not 1 <= self.num_experts_per_token <= self.num_experts:
      fail("num_experts_per_token",
           f"must be in [1, num_experts={self.num_experts}]")
    groups = self.num_expert_groups
    if groups < 1 or self.num_experts % groups:
      fail("num_expert_groups",
           f"must be a positive divisor of num_experts={self.num_experts}")
    if not 1 <= self.expert_groups_per_token <= groups:
      fail("expert_groups_per_token",
           f"must be in [1, num_expert_groups={groups}]")
    if (groups > 1 and self.expert_groups_per_token * self.num_experts
        // groups < self.num_experts_per_token):
      fail("expert_groups_per_token", "its groups hold fewer experts than"
           f" num_experts_per_token={self.num_experts_per_token}")
    for name in ("routed_scaling_factor", "capacity_factor"):
      if getattr(self, name) <= 0:
        fail(name, "must be positive")
    for name in ("load_balance_loss_weight", "router_z_loss_weight",
                 "router_bias_update_rate"):
      if getattr(self, name) < 0:
        fail(name, "must be >= 0 (0 turns it off)")
    if self.router_bias_update_rate and not self.router_bias:
      fail("router_bias_update_rate", "needs router_bias=True (there is no"
           " bias to move); set router_bias or use 0")

  def capacity(self, tokens: int) -> int:
    """Slots per expert of the capacity path for `tokens` tokens."""
    return math.ceil(self.capacity_factor * tokens *
                     self.num_experts_per_token / self.num_experts)


class AuxLoss(nnx.Intermediate):
  """A scalar a model adds to its training objective (sown by the model)."""


class RouterBias(nnx.Variable):
  """DeepSeek's expert-selection bias: not a `nnx.Param` (no gradient)."""


def route(logits_TE: jax.Array, cfg: MoeConfig,
          bias_E: jax.Array | None = None,
          scale_E: jax.Array | None = None) -> moe_experts.Routing:
  """Chooses `cfg.num_experts_per_token` experts per token (module doc);
  `scale_E` multiplies each chosen expert's weight by its own scale."""
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
    best = 1 if cfg.expert_group_score == "max" else min(2, experts // groups)
    group_score = jax.lax.top_k(grouped, best)[0].sum(-1)
    _, best_groups = jax.lax.top_k(group_score, cfg.expert_groups_per_token)
    keep = jnp.zeros((tokens, groups), bool).at[
        jnp.arange(tokens)[:, None], best_groups].set(True)
    # Experts of other groups score 0, as in DeepSeek's reference code.
    choice_TE = jnp.where(keep[:, :, None], grouped, 0.0).reshape(
        tokens, experts)
  _, experts_TA = jax.lax.top_k(choice_TE, cfg.num_experts_per_token)
  weights_TA = jnp.take_along_axis(scores_TE, experts_TA, axis=-1)
  if cfg.router_normalize:
    weights_TA = weights_TA / (weights_TA.sum(-1, keepdims=True) + 1e-20)
  if scale_E is not None:
    weights_TA = weights_TA * scale_E.astype(jnp.float32)[experts_TA]
  probs_TE = scores_TE
  if cfg.router_score == "sigmoid":
    probs_TE = scores_TE / scores_TE.sum(-1, keepdims=True)
  return moe_experts.Routing(weights_TA * cfg.routed_scaling_factor,
                             experts_TA.astype(jnp.int32), probs_TE,
                             cfg.weights_on_input)


def load_imbalance(load_lE: jax.Array) -> jax.Array:
  """Max over mean of the experts' loads [..., E], averaged over the rest.

  1 when perfectly balanced, E / k when every token picks the same experts.
  """
  load_lE = load_lE.astype(jnp.float32)
  return jnp.mean(load_lE.max(-1) / jnp.maximum(load_lE.mean(-1), 1e-20))


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

  def __init__(self, cfg: MoeConfig, *, activation: str, embed_dim: int,
               dtype: str, param_dtype: str, rngs: nnx.Rngs,
               norm_eps: float = 1e-6):
    """`norm_eps`: epsilon of the router's norm (`router_input_norm`)."""
    self.cfg = cfg
    self.norm_eps = norm_eps
    self.activation = activation
    self.dtype = dtype
    experts, dim, hidden = cfg.num_experts, embed_dim, cfg.mlp_dim
    self.router = linear.Linear(
        (dim,), (experts,), in_axes=(axes.EMBED,),
        out_axes=(moe_experts.EXPERTS,),
        dtype="float32", param_dtype=param_dtype, rngs=rngs,
        use_bias=cfg.router_logit_bias)
    init = nnx.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=2,
        batch_axis=(0,))
    param_dtype = jnp.dtype(param_dtype)
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
    self.router_scale = (
        axes.param(jnp.ones((dim,), param_dtype), (axes.EMBED,))
        if cfg.router_input_norm else None)
    self.expert_scale = (
        axes.param(jnp.ones((experts,), param_dtype), (moe_experts.EXPERTS,))
        if cfg.router_per_expert_scale else None)
    if cfg.num_shared_experts:
      self.shared = mlp.MLP(
          mlp.MlpConfig(dim=cfg.shared_mlp_dim or
                        cfg.num_shared_experts * hidden,
                        activation=activation),
          embed_dim=embed_dim, dtype=dtype, param_dtype=param_dtype.name,
          rngs=rngs, output_gate=cfg.shared_expert_gate)
    else:
      self.shared = None

  def __call__(self, x_BLD: jax.Array,
               residual_BLD: jax.Array | None = None
               ) -> tuple[jax.Array, dict]:
    """`residual_BLD`: the stream the router reads with
    `router_input_norm` (required then)."""
    cfg = self.cfg
    batch, length, dim = x_BLD.shape
    dtype = jnp.dtype(self.dtype)
    x_TD = x_BLD.reshape(batch * length, dim).astype(dtype)
    router_in_TD = x_TD
    if self.router_scale is not None:
      router_in_TD = (norm.normalize(residual_BLD.reshape(-1, dim),
                                     self.norm_eps)
                      * self.router_scale[...].astype(jnp.float32)
                      * dim ** -0.5)
    logits_TE = self.router(router_in_TD)
    bias_E, scale_E = (None if v is None else v[...]
                       for v in (self.router_bias, self.expert_scale))
    routing = route(logits_TE, cfg, bias_E, scale_E)
    if self.gate_up is None:
      gate_EDF, up_EDF = self.gate[...], self.up[...]
    else:
      gate_EDF, up_EDF = self.gate_up[:, :, 0], self.gate_up[:, :, 1]
    biases = [None if b is None else b[...].astype(dtype)
              for b in (self.gate_up_bias, self.down_bias)]
    weights = moe_experts.ExpertWeights(
        gate_EDF.astype(dtype), up_EDF.astype(dtype),
        self.down[...].astype(dtype), mlp.GATED_UNITS[self.activation],
        *biases)
    dropped = jnp.zeros((), jnp.int32)
    if cfg.impl == "dropless":
      y_TD = moe_parallel.sharded_dropless(x_TD, routing, weights,
                                           cfg.expert_exchange,
                                           cfg.expert_chunks)
    elif cfg.impl == "capacity":
      y_TD, dropped = moe_experts.capacity_experts(
          x_TD, routing, weights, cfg.capacity(x_TD.shape[0]))
    else:
      y_TD = moe_experts.dense_experts(x_TD, routing, weights)
    y_BLD = y_TD.reshape(batch, length, dim)
    if self.shared is not None:
      y_BLD = y_BLD + self.shared(x_BLD)
    load_E = moe_experts.expert_counts(routing.experts_TA, cfg.num_experts)
    balance = moe_experts.load_balance_loss(routing, cfg.num_experts,
                                            load_E)
    z_loss = moe_experts.router_z_loss(logits_TE)
    aux = {
        "loss": (cfg.load_balance_loss_weight * balance
                 + cfg.router_z_loss_weight * z_loss),
        "load_balance_loss": balance,
        "router_z_loss": z_loss,
        "dropped_fraction": dropped / routing.experts_TA.size,
        "expert_load": load_E.astype(jnp.float32),
    }
    return y_BLD.astype(x_BLD.dtype), aux
