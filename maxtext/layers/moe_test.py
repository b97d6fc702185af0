"""Tests of the mixture-of-experts layer against numpy and each other."""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.layers import mlp
from maxtext.layers import moe
from maxtext.layers import moe_experts
from testing import trees

_CFG = moe.MoeConfig(num_experts=4, num_experts_per_token=2, mlp_dim=6)


def _silu(x):
  return x / (1 + np.exp(-x))


def _numpy_route(logits, k, *, sigmoid=False, bias=None, groups=1,
                 groups_per_token=1, group_score="top2_sum", normalize=True,
                 scale=1.0):
  """Top-k routing, one token at a time."""
  weights, experts = [], []
  for row in logits.astype(np.float64):
    if sigmoid:
      scores = 1 / (1 + np.exp(-row))
    else:
      scores = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    choice = scores + (0 if bias is None else bias)
    if groups > 1:
      per_group = choice.reshape(groups, -1)
      best_two = np.sort(per_group, axis=1)[:, -2:]
      score = (best_two[:, -1] if group_score == "max"
               else best_two.sum(1))
      best = np.argsort(-score)[:groups_per_token]
      mask = np.zeros_like(per_group)
      mask[best] = 1
      choice = (per_group * mask).reshape(-1)
    chosen = np.argsort(-choice, kind="stable")[:k]
    w = scores[chosen]
    if normalize:
      w = w / w.sum()
    weights.append(w * scale)
    experts.append(chosen)
  return np.array(weights), np.array(experts)


def _numpy_moe(x, weights, experts, layer, kept=None):
  """sum_k w_k * down(silu(gate) * up) over each token's chosen experts."""
  gate, up, down = (np.asarray(p[...]) for p in
                    (layer.gate, layer.up, layer.down))
  out = np.zeros_like(x, dtype=np.float64)
  for t in range(x.shape[0]):
    for j, e in enumerate(experts[t]):
      if kept is not None and not kept[t, j]:
        continue
      out[t] += weights[t, j] * ((_silu(x[t] @ gate[e]) * (x[t] @ up[e]))
                                 @ down[e])
  return out


def _clamped_swiglu(gate, up):
  """GPT-OSS's unit as transformers' GptOssExperts._apply_gate writes it."""
  gate = np.minimum(gate, 7.0)
  up = np.clip(up, -7.0, 7.0)
  return (up + 1) * gate / (1 + np.exp(-1.702 * gate))


def _numpy_gpt_oss_moe(x, layer):
  """transformers' GptOssMLP one token at a time: router logits with bias,
  softmax over the top-k logits, biased experts with the clamped SwiGLU
  (our gate_up layout [E, D, 2, F])."""
  logits = x @ np.asarray(layer.router.kernel[...]) + np.asarray(
      layer.router.bias[...])
  gate_up = np.asarray(layer.gate_up[...])
  gate_up_bias = np.asarray(layer.gate_up_bias[...])
  down, down_bias = (np.asarray(p[...]) for p in (layer.down,
                                                   layer.down_bias))
  k = layer.cfg.num_experts_per_token
  out = np.zeros_like(x, dtype=np.float64)
  for t, row in enumerate(logits.astype(np.float64)):
    chosen = np.argsort(-row, kind="stable")[:k]
    w = np.exp(row[chosen] - row[chosen].max())
    w /= w.sum()
    for weight, e in zip(w, chosen):
      gate = x[t] @ gate_up[e, :, 0] + gate_up_bias[e, 0]
      up = x[t] @ gate_up[e, :, 1] + gate_up_bias[e, 1]
      out[t] += weight * (_clamped_swiglu(gate, up) @ down[e] + down_bias[e])
  return out


class RouteTest(parameterized.TestCase):

  @parameterized.parameters(True, False)
  def test_softmax_top_k(self, normalize):
    cfg = dataclasses.replace(_CFG, router_normalize=normalize)
    logits = np.random.RandomState(0).normal(size=(10, 4)).astype(np.float32)
    routing = moe.route(jnp.asarray(logits), cfg)
    weights, experts = _numpy_route(logits, 2, normalize=normalize)
    np.testing.assert_array_equal(routing.experts_TA, experts)
    np.testing.assert_allclose(routing.weights_TA, weights, rtol=1e-6)

  def test_sigmoid_bias_groups_scaling(self):
    cfg = dataclasses.replace(
        _CFG, num_experts=8, num_experts_per_token=3, router_score="sigmoid",
        router_bias=True, num_expert_groups=4, expert_groups_per_token=2,
        routed_scaling_factor=2.5)
    rng = np.random.RandomState(1)
    logits = rng.normal(size=(16, 8)).astype(np.float32)
    bias = rng.normal(scale=0.5, size=8).astype(np.float32)
    routing = moe.route(jnp.asarray(logits), cfg, jnp.asarray(bias))
    weights, experts = _numpy_route(logits, 3, sigmoid=True, bias=bias,
                                    groups=4, groups_per_token=2, scale=2.5)
    np.testing.assert_array_equal(routing.experts_TA, experts)
    np.testing.assert_allclose(routing.weights_TA, weights, rtol=1e-5)
    # The bias changes the choice but not the weights' source: the scores.
    unbiased = moe.route(jnp.asarray(logits), cfg)
    self.assertFalse(np.array_equal(unbiased.experts_TA, routing.experts_TA))


  def test_softmax_groups_scored_by_their_best_expert(self):
    """DeepSeek-V2's group-limited greedy routing: softmax scores, a group
    scores its best expert, weights not normalised, then scaled."""
    cfg = dataclasses.replace(
        _CFG, num_experts=8, num_experts_per_token=3, num_expert_groups=4,
        expert_groups_per_token=2, expert_group_score="max",
        router_normalize=False, routed_scaling_factor=16.0)
    logits = np.random.RandomState(2).normal(
        scale=2.0, size=(32, 8)).astype(np.float32)
    routing = moe.route(jnp.asarray(logits), cfg)
    weights, experts = _numpy_route(logits, 3, groups=4, groups_per_token=2,
                                    group_score="max", normalize=False,
                                    scale=16.0)
    np.testing.assert_array_equal(routing.experts_TA, experts)
    np.testing.assert_allclose(routing.weights_TA, weights, rtol=1e-5)
    # Some token picks other experts when a group scores its best two.
    top2 = moe.route(jnp.asarray(logits), dataclasses.replace(
        cfg, expert_group_score="top2_sum"))
    self.assertFalse(np.array_equal(top2.experts_TA, routing.experts_TA))


class LossesTest(absltest.TestCase):

  def test_load_balance_loss_by_hand(self):
    # 4 tokens, 3 experts, top-1. Assignments: e0, e0, e1, e2 -> f = (2, 1,
    # 1) / 4; mean probs p = column means of probs_TE.
    probs = np.array([[.5, .3, .2], [.6, .2, .2], [.2, .7, .1],
                      [.1, .1, .8]], np.float32)
    routing = moe_experts.Routing(jnp.ones((4, 1)),
                                  jnp.array([[0], [0], [1], [2]]),
                                  jnp.asarray(probs))
    p = probs.mean(0)  # (0.35, 0.325, 0.325)
    want = 3 * (0.5 * p[0] + 0.25 * p[1] + 0.25 * p[2])  # 1.0125
    self.assertAlmostEqual(want, 1.0125, places=6)
    self.assertAlmostEqual(float(moe_experts.load_balance_loss(routing, 3)), want,
                           places=6)

  def test_router_z_loss(self):
    logits = np.random.RandomState(2).normal(size=(5, 4))
    want = np.mean(np.log(np.exp(logits).sum(-1))**2)
    self.assertAlmostEqual(float(moe_experts.router_z_loss(jnp.asarray(logits))),
                           want, places=5)

  def test_update_router_bias(self):
    # Counts (3, 1, 2, 2), mean 2: expert 0 down, 1 up, 2 and 3 unchanged.
    experts = jnp.array([[0, 1], [0, 2], [0, 3], [2, 3]])
    load = moe_experts.expert_counts(experts, 4)
    bias = moe.update_router_bias(jnp.zeros(4), load, rate=0.01)
    np.testing.assert_allclose(bias, [-0.01, 0.01, 0.0, 0.0])
    # Batched over layers; the second layer is balanced.
    bias = moe.update_router_bias(jnp.zeros((2, 4)),
                                  jnp.stack([load, jnp.ones(4)]), rate=0.01)
    np.testing.assert_allclose(bias, [[-0.01, 0.01, 0.0, 0.0], [0.0] * 4])

  def test_load_imbalance(self):
    # Layer loads (3, 1, 2, 2) and (4, 0, 0, 0): max / mean 1.5 and 4.
    load = jnp.array([[3.0, 1.0, 2.0, 2.0], [4.0, 0.0, 0.0, 0.0]])
    self.assertAlmostEqual(float(moe.load_imbalance(load)), (1.5 + 4) / 2,
                           places=6)


class MoETest(parameterized.TestCase):

  def _layer_and_input(self, activation="silu", **changes):
    cfg = dataclasses.replace(_CFG, **changes)
    layer = moe.MoE(cfg, activation=activation, embed_dim=8, dtype="float32",
                    param_dtype="float32", rngs=nnx.Rngs(0))
    x = np.random.RandomState(3).normal(size=(2, 5, 8)).astype(np.float32)
    return cfg, layer, x

  @parameterized.parameters("dropless", "capacity", "dense")
  def test_matches_numpy(self, impl):
    # capacity_factor 2 = E / k: every expert can take every token.
    cfg, layer, x = self._layer_and_input(impl=impl, capacity_factor=2.0)
    y, aux = layer(jnp.asarray(x))
    x_TD = x.reshape(10, 8)
    logits = x_TD @ np.asarray(layer.router.kernel[...])
    weights, experts = _numpy_route(logits, 2)
    want = _numpy_moe(x_TD, weights, experts, layer)
    np.testing.assert_allclose(y.reshape(10, 8), want, rtol=1e-4, atol=1e-5)
    self.assertEqual(float(aux["dropped_fraction"]), 0.0)
    np.testing.assert_array_equal(
        aux["expert_load"], np.bincount(experts.reshape(-1), minlength=4))

  @parameterized.parameters("dropless", "capacity", "dense")
  def test_gpt_oss_experts_match_numpy(self, impl):
    _, layer, x = self._layer_and_input(
        impl=impl, capacity_factor=2.0, activation="clamped_swiglu",
        router_logit_bias=True, expert_bias=True, expert_gate_up_fused=True)
    self.assertIsNone(layer.gate)
    self.assertEqual(layer.gate_up.shape, (4, 8, 2, 6))
    rng = np.random.RandomState(5)
    # Large weights push the gate and up projections past the clamp (7).
    layer.gate_up[...] = rng.normal(scale=2.0, size=(4, 8, 2, 6))
    for bias in (layer.router.bias, layer.gate_up_bias, layer.down_bias):
      bias[...] = rng.normal(size=bias.shape)
    y, _ = layer(jnp.asarray(x))
    x_TD = x.reshape(10, 8)
    gate = np.einsum("td,edf->tef", x_TD, np.asarray(layer.gate_up[:, :, 0]))
    self.assertGreater((gate > 7).sum(), 0)
    # Outputs reach ~35: within 1e-5 of the largest.
    trees.assert_close(y.reshape(10, 8), _numpy_gpt_oss_moe(x_TD, layer),
                       rtol=1e-4, scaled_atol=1e-5)

  @parameterized.parameters("dropless", "capacity", "dense")
  def test_weights_on_input_match_numpy(self, impl):
    """Llama 4: sigmoid of the top-k logits, not renormalised, scales each
    chosen expert's input: sum_e MLP_e(w_e * x)."""
    _, layer, x = self._layer_and_input(
        impl=impl, capacity_factor=2.0, router_score="sigmoid",
        router_normalize=False, weights_on_input=True)
    y, _ = layer(jnp.asarray(x))
    x_TD = x.reshape(10, 8).astype(np.float64)
    logits = x_TD @ np.asarray(layer.router.kernel[...])
    gate, up, down = (np.asarray(w[...], np.float64)
                      for w in (layer.gate, layer.up, layer.down))
    want = np.zeros_like(x_TD)
    for t, row in enumerate(logits):
      for e in np.argsort(-row)[:2]:
        x_D = x_TD[t] / (1 + np.exp(-row[e]))
        want[t] += (_silu(x_D @ gate[e]) * (x_D @ up[e])) @ down[e]
    np.testing.assert_allclose(y.reshape(10, 8), want, rtol=1e-4, atol=1e-5)
    output_weighted, _ = self._layer_and_input(
        impl=impl, capacity_factor=2.0, router_score="sigmoid",
        router_normalize=False)[1](jnp.asarray(x))
    self.assertGreater(float(jnp.abs(output_weighted - y).max()), 1e-3)

  def test_paths_equal_with_gradients(self):
    """Dropless and capacity (nothing dropped) equal the dense reference,
    forward and gradients, router included."""
    cfg, layer, x = self._layer_and_input(load_balance_loss_weight=0.1,
                                          router_z_loss_weight=0.01,
                                          capacity_factor=2.0)
    graphdef, state = nnx.split(layer)

    def loss(state, x, impl):
      module = nnx.merge(graphdef, state)
      module.cfg = dataclasses.replace(cfg, impl=impl)
      y, aux = module(x)
      return jnp.sum(jnp.sin(y)) + aux["loss"]

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)),
                   static_argnums=2)
    want_value, (want_state, want_x) = grad(state, x, "dense")
    router_grad = want_state["router"]["kernel"][...]
    self.assertGreater(float(jnp.abs(router_grad).max()), 1e-3)
    for impl in ("dropless", "capacity"):
      value, (got_state, got_x) = grad(state, x, impl)
      self.assertAlmostEqual(float(value), float(want_value), places=4)
      # Gradients in another summation order: within 1e-4 of each leaf's
      # largest magnitude.
      trees.assert_close(got_x, want_x, rtol=1e-4, scaled_atol=1e-4)
      trees.assert_trees_close(got_state, want_state, rtol=1e-4,
                               scaled_atol=1e-4)

  def test_capacity_drops_and_counts(self):
    cfg, layer, x = self._layer_and_input(impl="capacity",
                                          capacity_factor=0.5)
    slots = cfg.capacity(10)  # ceil(0.5 * 10 * 2 / 4) = 3.
    self.assertEqual(slots, 3)
    y, aux = layer(jnp.asarray(x))
    x_TD = x.reshape(10, 8)
    weights, experts = _numpy_route(x_TD @ np.asarray(layer.router.kernel[...]),
                                    2)
    taken = np.zeros(4, int)
    kept = np.zeros((10, 2), bool)
    for t in range(10):
      for j in range(2):
        kept[t, j] = taken[experts[t, j]] < slots
        taken[experts[t, j]] += 1
    self.assertGreater((~kept).sum(), 0)
    self.assertAlmostEqual(float(aux["dropped_fraction"]),
                           (~kept).sum() / 20, places=6)
    want = _numpy_moe(x_TD, weights, experts, layer,
                      kept=kept)
    np.testing.assert_allclose(y.reshape(10, 8), want, rtol=1e-4, atol=1e-5)

  def test_shared_experts_add_an_mlp(self):
    cfg, layer, x = self._layer_and_input(num_shared_experts=2)
    self.assertEqual(layer.shared.gate.kernel.shape, (8, 12))
    y, _ = layer(jnp.asarray(x))
    routed = nnx.clone(layer)
    routed.shared = None
    want = routed(jnp.asarray(x))[0] + layer.shared(jnp.asarray(x))
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)

  def test_aux_loss_is_weighted_sum(self):
    _, layer, x = self._layer_and_input(load_balance_loss_weight=0.1,
                                        router_z_loss_weight=0.01)
    _, aux = layer(jnp.asarray(x))
    self.assertAlmostEqual(
        float(aux["loss"]), 0.1 * float(aux["load_balance_loss"])
        + 0.01 * float(aux["router_z_loss"]), places=6)


class RoutedExpertsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # One expert of six (an expert-parallel shard of Mixtral's kind),
      # experts 2-4 with biases, and weights on the inputs (Llama 4).
      ("one_of_six", 5, 1, False, False),
      ("three_of_six_biased", 2, 3, False, True),
      ("two_of_six_on_input", 0, 2, True, False),
  )
  def test_equals_dense_experts_with_gradients(self, first, local, on_input,
                                               biases):
    """`routed_experts` (only the assignments to `w`'s experts, through
    the grouped matmul) equals `dense_experts` (every token through every
    one of them), forward and gradients; tokens that chose none of them
    get zeros."""
    rng = np.random.RandomState(0)
    tokens, k, dim, hidden = 37, 2, 8, 5
    experts_TA = np.stack([rng.choice(6, k, replace=False)
                           for _ in range(tokens)]).astype(np.int32)
    weights_TA = rng.uniform(0.1, 1, (tokens, k)).astype(np.float32)
    routing = moe_experts.Routing(jnp.asarray(weights_TA),
                                  jnp.asarray(experts_TA), None, on_input)
    x_TD = rng.normal(size=(tokens, dim)).astype(np.float32)
    arrays = [rng.normal(size=shape).astype(np.float32) for shape in (
        (local, dim, hidden), (local, dim, hidden), (local, hidden, dim))]
    if biases:
      arrays += [rng.normal(size=(local, 2, hidden)).astype(np.float32),
                 rng.normal(size=(local, dim)).astype(np.float32)]

    def loss(fn, x_TD, arrays):
      w = moe_experts.ExpertWeights(*arrays[:3], mlp.GATED_UNITS["silu"],
                                    *arrays[3:])
      y_TD = fn(x_TD, routing, w, first)
      return jnp.sum(jnp.sin(y_TD)), y_TD

    grads = {fn: jax.jit(jax.grad(functools.partial(loss, fn),
                                  argnums=(0, 1), has_aux=True))(
                                      x_TD, arrays)
             for fn in (moe_experts.routed_experts,
                        moe_experts.dense_experts)}
    (got_grads, got), (want_grads, want) = grads.values()
    mine_T = np.any((experts_TA >= first) & (experts_TA < first + local), 1)
    self.assertTrue(mine_T.any() and not mine_T.all())
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got)[~mine_T], 0)
    # The gradients of sum(sin(y)) for y of ~40 cancel to O(1) from terms
    # of ~40 (one CPU's kernels gave -0.87091 for -0.87109): within 1e-4
    # of each leaf's largest magnitude.
    trees.assert_trees_close(got_grads, want_grads, rtol=1e-4,
                             scaled_atol=1e-4)


class MoEConfigTest(absltest.TestCase):

  def test_bad_values_name_the_field(self):
    for changes, field in ((dict(num_experts_per_token=5), "num_experts_per"),
                           (dict(num_expert_groups=3), "num_expert_groups"),
                           (dict(impl="sparse"), "moe_impl"),
                           (dict(expert_group_score="sum"),
                            "expert_group_score.*top2_sum"),
                           (dict(mlp_dim=0), "moe_mlp_dim"),
                           (dict(router_bias_update_rate=0.001),
                            "router_bias_update_rate.*router_bias=True"),
                           (dict(router_bias=True,
                                 router_bias_update_rate=-0.001),
                            "router_bias_update_rate.*>= 0"),
                           (dict(expert_chunks=0),
                            "moe_expert_chunks=0.*integer >= 1"),
                           (dict(expert_chunks=True),
                            "moe_expert_chunks=True.*integer >= 1")):
      with self.assertRaisesRegex(ValueError, field):
        dataclasses.replace(_CFG, **changes)

  def test_expert_options_need_experts(self):
    for name in ("router_logit_bias", "expert_bias", "expert_gate_up_fused"):
      with self.assertRaisesRegex(ValueError, f"num_experts.*{name}"):
        dataclasses.replace(_CFG, num_experts=0, **{name: True})


if __name__ == "__main__":
  absltest.main()
