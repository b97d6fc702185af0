"""Mixture of experts in the train step: auxiliary losses and expert
parallelism.

AuxLossTest: the load-balancing and router z-losses the model sows reach the
training gradients: the gradients with the losses on minus those with them
off equal the gradients of the sown losses alone.

RouterBiasTest: with a sigmoid router, a router bias and
router_bias_update_rate 0.01, the bias after each of 12 train steps equals a
numpy re-computation (bias += rate * sign(mean load - load)) from the loads
of each step's forward pass, stays out of the parameters and the optimizer
state, and the logged load imbalance (max / mean load) of the last 6 steps
is lower than with the rate at 0 (measured 1.23 vs 1.31). Unscanned
layers' biases move by their own layer's loads.

DroppedTokenMetricsTest: with capacity factor 0.5, the train step's
`moe/dropped_fraction` equals the drops counted from each layer's expert
loads and capacity, `moe/load_imbalance` the loads' max / mean, and
`moe/load_balance_loss` the sown auxiliary loss over its weight.

SowDeprecationTest: a tiny DeepSeek-V3 (experts and multi-token prediction;
unscanned, and scanned with remat and 2 microbatches) traces its train
step, eval step and a plain forward pass with flax's "`Module.sow()`
outside `nnx.capture()`" DeprecationWarning turned into an error, and the
train step still gets every sown value.

ExpertParallelismTest (8 fake CPU devices; the Bazel target sets
JAX_NUM_CPU_DEVICES=8): a tiny Mixtral (4
experts, top-2) on a data=1 x fsdp=2 x expert=4 mesh with the default rule
tables has its expert weights split over the `expert` axis, and its loss,
gradients and one train step equal those on one device (fp32), for the
dropless path and for the capacity path with tokens dropped (capacity is
computed over the global batch, so the same ones are). Adam's first step
is lr * g / (|g| + eps): with the usual eps (1e-8) a rounding difference
of ~3e-9 in a near-zero gradient entry (seen: an embedding entry) becomes
a change of up to lr / 3, so these states use eps 1e-4, which bounds it by
lr * 3e-9 / 1e-4. With drops, gradient entries that are zero up to
rounding can round either way, so there the step is still not compared.
Both paths' compiled steps exchange tokens with all-to-all; the dropless
one (also on an expert=8 mesh with 8 experts) sends [1, S/8, D] buffers
and gathers neither whole expert weights nor the batch's assignments. One
MoE layer with GPT-OSS's expert biases and fused gate_up, its 8 experts
over expert=8, has the output and gradients of the unsharded layer. Tiny
Llama 4 and Gemma 4 26b-a4b models over fsdp=2 x tensor=2 x expert=2: one
step equals one device's.
"""

import re
import warnings

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import common
from configs import mixtral
from maxtext.common import axes
from maxtext.layers import moe
from maxtext.layers import moe_parallel
from maxtext.layers import remat
from maxtext.models import decoder
from maxtext.models import execution
from maxtext.models import gemma4
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import eval_step as eval_step_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import devices
from testing import tiny_configs
from testing import trees

_RTOL = 1e-4
_ATOL = 1e-5


def _state(ici, devices, family="mixtral", microbatches=1,
           remat_policy="none", **model_changes):
  """A tiny Mixtral (or `family`) with 4 experts (2 layers) on a mesh of
  `devices`, its blocks under `remat_policy`."""
  config = mixtral.get_config()
  opt_config = optimizer.OptimizerConfig(**{
      **config.optimizer.to_dict(), "learning_rate": 1e-2,
      "warmup_steps": 1, "eps": 1e-4})
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)), devices)
  rules = rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))
  model_config = tiny_configs.tiny_model_config(
      family, window=4, num_layers=2).replace(
          **{"num_experts": 4, **model_changes})
  return train_state_lib.create_train_state(
      model_config, seed=0, execution=execution.Execution(
          remat=remat.RematConfig(policy=remat_policy)),
      tx=optimizer.make_optimizer(opt_config, total_steps=10),
      schedule=optimizer.learning_rate_schedule(opt_config, total_steps=10),
      z_loss=0.0, mesh=mesh, rules=rules, microbatches=microbatches)


def _batch(state, rows=8, length=8, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, 64, size=(rows, length + 1), dtype=np.int32)
  sharding = state.rules.batch_sharding((rows, length))
  return {key: jax.device_put(value, sharding) for key, value in
          {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "mask": np.ones((rows, length), np.int32)}.items()}


@jax.jit
def _loss_grads_and_params(state, batch):
  loss, z_term, grads, moe_stats = train_step_lib.loss_and_grads(state, batch)
  new_state, _ = train_step_lib.apply_gradients(state, loss, z_term, grads,
                                                moe_stats)
  return loss, grads, new_state.params


def _assert_trees_close(got, want, rtol=_RTOL, atol=_ATOL, scaled_atol=1e-4):
  """Leaf by leaf within `rtol` and `atol`, or `scaled_atol` times the
  leaf's largest magnitude if larger (gradients summed in another order
  differ with the magnitudes summed, not with the element)."""
  trees.assert_trees_close(got, want, rtol=rtol, atol=atol,
                           scaled_atol=scaled_atol)


class AuxLossTest(absltest.TestCase):

  def test_aux_loss_reaches_the_training_gradients(self):
    one_device = ({"data": 1}, jax.devices()[:1])
    with_aux = _state(*one_device, load_balance_loss_weight=0.1,
                      router_z_loss_weight=0.01)
    without = _state(*one_device, load_balance_loss_weight=0.0,
                     router_z_loss_weight=0.0)
    batch = _batch(with_aux)
    grads = jax.jit(train_step_lib.loss_and_grads)
    _, _, grads_with, _ = grads(with_aux, batch)
    _, _, grads_without, _ = grads(without, batch)

    def aux_objective(params):
      model = with_aux.replace(params=params).model()
      _, aux_losses = nnx.capture(model, moe.AuxLoss)(batch["inputs"])
      return sum(jax.tree.leaves(aux_losses))

    want = jax.jit(jax.grad(aux_objective))(with_aux.params)
    router = want["blocks"]["moe"]["router"]["kernel"]
    self.assertGreater(float(jnp.abs(router).max()), 1e-4)
    _assert_trees_close(jax.tree.map(jnp.subtract, grads_with, grads_without),
                        want, rtol=1e-3, atol=1e-6)


def _one_device_state(**model_changes):
  return _state({"data": 1}, jax.devices()[:1], **model_changes)


class RouterBiasTest(absltest.TestCase):

  def _train(self, rate, steps):
    """Trains a sigmoid-routed tiny model; returns the biases before each
    step and after the last, each step's loads and load imbalances."""
    state = _one_device_state(router_score="sigmoid", router_bias=True,
                              router_bias_update_rate=rate)
    stats = jax.jit(lambda s, b: train_step_lib.loss_and_grads(s, b)[3])
    biases, loads, imbalances = [], [], []
    for step in range(steps):
      batch = _batch(state, seed=step)
      biases.append(np.asarray(
          state.model_state["blocks"]["moe"]["router_bias"]))
      loads.append(np.asarray(stats(state, batch)["expert_load"]))
      state, metrics = train_step_lib.train_step(state, batch)
      imbalances.append(float(metrics["moe/load_imbalance"]))
    biases.append(np.asarray(
        state.model_state["blocks"]["moe"]["router_bias"]))
    return state, biases, loads, imbalances

  def test_bias_follows_the_loads_and_balances_them(self):
    rate, steps = 0.01, 12
    state, biases, loads, imbalances = self._train(rate, steps)
    # Model state, not a parameter: no gradient, no optimizer (or weight
    # decay) state.
    params = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(
        (state.params, state.opt_state))[0])
    self.assertNotIn("router_bias", params)
    want = np.zeros((2, 4), np.float32)  # [layers, experts], starts at 0.
    for step in range(steps):
      load = loads[step]
      self.assertEqual(load.sum(), 2 * 64 * 2)  # layers * tokens * k.
      np.testing.assert_allclose(
          imbalances[step], np.mean(load.max(-1) / load.mean(-1)), rtol=1e-6)
      want = want + rate * np.sign(load.mean(-1, keepdims=True) - load)
      np.testing.assert_allclose(biases[step + 1], want, atol=1e-7)
    self.assertGreater(np.abs(want).max(), 0)
    _, _, _, imbalances_off = self._train(0.0, steps)
    late_on = np.mean(imbalances[steps // 2:])
    late_off = np.mean(imbalances_off[steps // 2:])
    print(f"load imbalance (max/mean), steps {steps // 2}-{steps - 1}:"
          f" rate {rate}: {late_on:.3f}, rate 0: {late_off:.3f}")
    self.assertLess(late_on, late_off)


  def test_unscanned_layers_move_in_layer_order(self):
    cfg = tiny_configs.tiny_model_config(
        "mixtral", window=4, num_layers=2).replace(
        num_experts=4, scan_layers=False, router_score="sigmoid",
        router_bias=True, router_bias_update_rate=0.01)
    model = decoder.Decoder(cfg, rngs=nnx.Rngs(0))
    model.update_router_bias(jnp.array([[3.0, 1.0, 2.0, 2.0],
                                        [0.0, 4.0, 2.0, 2.0]]))
    np.testing.assert_allclose(
        [block.moe.router_bias[...] for block in model.blocks],
        [[-0.01, 0.01, 0.0, 0.0], [0.01, -0.01, 0.0, 0.0]])


class DroppedTokenMetricsTest(absltest.TestCase):

  def test_metrics_equal_the_layers_counts(self):
    state = _one_device_state(moe_impl="capacity", capacity_factor=0.5,
                              load_balance_loss_weight=0.1)
    batch = _batch(state)
    model = state.model()
    # 64 tokens * 2 experts each over 4 experts: 16 slots per expert.
    slots = model.cfg.moe.capacity(64)
    _, aux_losses, stats = nnx.capture(model, moe.AuxLoss,
                                       nnx.Intermediate)(batch["inputs"])
    aux_loss = float(sum(jax.tree.leaves(aux_losses)))
    load = np.asarray(stats["expert_load"][...])
    _, metrics = train_step_lib.train_step(state, batch)
    self.assertEqual(slots, 16)
    # Each layer drops what its experts got past their slots.
    dropped = np.maximum(load - slots, 0).sum(-1) / (64 * 2)
    self.assertGreater(dropped.min(), 0)
    self.assertAlmostEqual(float(metrics["moe/dropped_fraction"]),
                           dropped.mean(), places=6)
    self.assertAlmostEqual(float(metrics["moe/load_imbalance"]),
                           np.mean(load.max(-1) / load.mean(-1)), places=5)
    # Its weighted sum over the 2 layers is the objective's auxiliary loss.
    self.assertAlmostEqual(
        0.1 * 2 * float(metrics["moe/load_balance_loss"]), aux_loss,
        places=5)
    self.assertIn("moe/router_z_loss", metrics)


class SowDeprecationTest(parameterized.TestCase):
  """flax 0.12.8 deprecates `Module.sow` outside `nnx.capture`."""

  @parameterized.named_parameters(
      ("unscanned", 1, dict(scan_layers=False)),
      ("scanned_remat_2_microbatches", 2, dict(remat_policy="full")),
  )
  def test_steps_raise_no_sow_deprecation(self, microbatches, model_changes):
    # DeepSeek-V3: a dense layer, an expert layer (its own 16 experts,
    # sigmoid router with bias) and a prediction depth with experts.
    state = _state({"data": 1}, jax.devices()[:1], family="deepseek3",
                   microbatches=microbatches, num_experts=16, mtp_layers=1,
                   **model_changes)
    batch = _batch(state)
    # The model sows while traced: tracing (no other test traces this
    # model, so nothing comes from a cache) is enough, and fast.
    with warnings.catch_warnings():
      warnings.filterwarnings("error", message=".*sow.*",
                              category=DeprecationWarning)
      _, _, _, stats = jax.eval_shape(train_step_lib.loss_and_grads, state,
                                      batch)
      _, metrics = jax.eval_shape(train_step_lib.train_step, state, batch)
      jax.eval_shape(eval_step_lib.eval_step, state, batch)
      # As evaluation and Tunix's trainers call it.
      jax.eval_shape(lambda: state.model()(batch["inputs"]))
    # The step still gets every sown value.
    self.assertEqual(set(stats), {"load_balance_loss", "router_z_loss",
                                  "dropped_fraction", "expert_load",
                                  "mtp_loss"})
    self.assertEqual(stats["expert_load"].shape, (1, 16))
    self.assertContainsSubset(
        {"train/mtp_loss", "moe/load_balance_loss", "moe/load_imbalance"},
        set(metrics))


class ExpertParallelismTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  @parameterized.named_parameters(
      ("dropless_fsdp2_expert4", {"fsdp": 2, "expert": 4},
       dict(moe_impl="dropless", moe_expert_exchange="all_to_all")),
      ("dropless_expert8", {"expert": 8},
       dict(moe_impl="dropless", num_experts=8,
            moe_expert_exchange="all_to_all")),
      # "auto" with one expert per shard and two per token.
      ("dropless_gathered_fsdp2_expert4", {"fsdp": 2, "expert": 4},
       dict(moe_impl="dropless")),
      ("dropless_gathered_expert8", {"expert": 8},
       dict(moe_impl="dropless", num_experts=8,
            moe_expert_exchange="all_gather")),
      # The gathered tokens in two rematerialised chunks.
      ("dropless_gathered_chunks_fsdp2_expert4", {"fsdp": 2, "expert": 4},
       dict(moe_impl="dropless", moe_expert_chunks=2)),
      ("capacity_with_drops_fsdp2_expert4", {"fsdp": 2, "expert": 4},
       dict(moe_impl="capacity", capacity_factor=0.5)),
      # DeepSeek-V2: softmax routing within groups scored by their best
      # expert, shared experts, a dense first layer.
      ("deepseek2_dropless_expert8", {"expert": 8},
       dict(family="deepseek2", moe_impl="dropless", num_experts=8,
            num_experts_per_token=2, moe_expert_exchange="all_to_all")),
  )
  def test_expert_sharded_equals_single_device(self, ici, model_changes):
    single = _state({"data": 1}, jax.devices()[:1], **model_changes)
    want = _loss_grads_and_params(single, _batch(single))
    state = _state({"data": 1, **ici}, jax.devices(), **model_changes)
    # Each device holds one expert (of both layers) of each fsdp shard.
    gate = state.params["blocks"]["moe"]["gate"]
    self.assertEqual(gate.sharding.spec[1], "expert")
    self.assertEqual(gate.addressable_shards[0].data.shape[1], 1)
    batch = _batch(state)
    got = _loss_grads_and_params(state, batch)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=_RTOL)
    _assert_trees_close(got[1], want[1])
    hlo = _loss_grads_and_params.lower(state, batch).compile().as_text()
    if model_changes["moe_impl"] == "capacity":
      self.assertIn("all-to-all", hlo)
      return  # Drops: the step is not compared (module doc).
    _assert_trees_close(got[2], want[2])
    if model_changes.get("moe_expert_exchange") == "all_to_all":
      # Tokens travel: each shard's S / 8 = 16 assignments go out in one
      # [1, 16, D=32] buffer per destination shard, and back.
      self.assertRegex(hlo, r"f32\[1,16,32\]\{[\d,]*\}\) all-to-all\(")
    else:
      # Each shard gathers its expert group's tokens and reduce-scatters
      # its experts' sums back; no assignment travels alone.
      self.assertNotRegex(hlo, r"f32\[1,16,32\]\{[\d,]*\}\) all-to-all\(")
      self.assertIn("reduce-scatter", hlo)
    # Neither the expert weights (with all their experts) nor the 128
    # assignments of the whole batch are gathered or all-reduced (XLA's
    # own partitioning of the dropless path gathers every assignment and
    # all-reduces the [128, D] outputs).
    full_shapes = set()
    for weight in ("gate", "up", "down"):
      shape = state.params["blocks"]["moe"][weight].shape
      full_shapes.update({shape, shape[1:]})
    collected = [
        tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(
            r"= \w+\[([\d,]*)\][^=]*? (?:all-gather|all-reduce)"
            r"(?:-start)?\(", hlo)]
    self.assertTrue(collected)  # The pattern finds the collectives.
    self.assertEqual([shape for shape in collected
                      if shape in full_shapes or shape[:1] == (128,)], [])


  def test_fsdp_dropless_runs_each_shards_own_tokens(self):
    """FSDP without expert parallelism: each shard runs the dropless
    experts on its own 8 tokens (16 assignments), so no buffer holds the
    batch's 128 assignments, and the step equals one device's."""
    single = _state({"data": 1}, jax.devices()[:1], moe_impl="dropless")
    want = _loss_grads_and_params(single, _batch(single))
    state = _state({"data": 1, "fsdp": 8}, jax.devices(),
                   moe_impl="dropless")
    batch = _batch(state)
    got = _loss_grads_and_params(state, batch)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=_RTOL)
    _assert_trees_close(got[1], want[1])
    _assert_trees_close(got[2], want[2])
    hlo = _loss_grads_and_params.lower(state, batch).compile().as_text()
    self.assertRegex(hlo, r"f32\[16,32\]")
    self.assertNotRegex(hlo, r"f32\[128,32\]")

  def _assert_sharded_step_equals_single_device(self, **changes):
    """One step of `_state(**changes)` over fsdp=2 x tensor=2 x expert=2
    equals one device's; returns the sharded state."""
    single = _state({"data": 1}, jax.devices()[:1], **changes)
    want = _loss_grads_and_params(single, _batch(single))
    state = _state({"data": 1, "fsdp": 2, "tensor": 2, "expert": 2},
                   jax.devices(), **changes)
    self.assertEqual(
        state.params["blocks"]["moe"]["gate_up"].sharding.spec[1], "expert")
    got = _loss_grads_and_params(state, _batch(state))
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=_RTOL)
    _assert_trees_close(got[1], want[1])
    _assert_trees_close(got[2], want[2])
    return state

  def test_llama4_sharded_equals_single_device(self):
    """Llama 4's layers (chunked and NoPE attention, experts on their
    inputs plus a shared expert, dense layers between) over fsdp, tensor
    and expert: one step equals one device's."""
    self._assert_sharded_step_equals_single_device(
        family="llama4", num_layers=4, moe_layer_interval=2)

  def test_gemma4_sharded_equals_single_device(self):
    """Gemma 4's 26b-a4b layers (experts next to the dense MLP, the router's
    own norm and per-expert scales; a global layer with wider heads and
    values equal to keys) over fsdp, tensor and expert: one step equals
    one device's."""
    state = self._assert_sharded_step_equals_single_device(
        family="gemma4", num_layers=3, moe_mlp_dim=16,
        **gemma4.MOE_ARCHITECTURE)
    self.assertIn("mlp", state.params["global_blocks"])

  @parameterized.parameters("all_to_all", "all_gather")
  def test_token_exchange_with_expert_biases(self, exchange):
    # GPT-OSS's per-expert biases, fused gate_up, 8 experts over expert=8:
    # the layer's output and gradients equal those without expert parallel.
    cfg = tiny_configs.tiny_model_config("mixtral", window=4).replace(
        num_experts=8, expert_bias=True, expert_gate_up_fused=True,
        moe_expert_exchange=exchange)
    graphdef, params = nnx.split(moe.MoE(
        cfg.moe, activation=cfg.mlp.activation, embed_dim=cfg.embed_dim,
        dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(1)
    params = jax.tree.map(
        lambda p: p + 0.1 * rng.normal(size=p.shape).astype(p.dtype), params)
    x = jnp.asarray(rng.normal(size=(8, 4, 32)), jnp.float32)
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(data=1, expert=8)))
    rules = rules_lib.LogicalRules.from_config(
        mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))

    def objective(params, x, rules):
      with axes.activation_sharding(rules):
        self.assertEqual(moe_parallel.expert_parallel_rules(8, 32), rules)
        y, _ = nnx.merge(graphdef, params)(x)
      return jnp.sum(jnp.sin(y))

    grad = jax.jit(jax.value_and_grad(objective, argnums=(0, 1)),
                   static_argnums=2)
    want_value, want_grads = grad(params, x, None)
    value, grads = grad(params, x, rules)
    self.assertAlmostEqual(float(value), float(want_value), places=3)
    bias_grad = want_grads[0]["down_bias"][...]
    self.assertGreater(float(jnp.abs(bias_grad).min()), 1e-6)
    _assert_trees_close(grads, want_grads)


if __name__ == "__main__":
  absltest.main()
