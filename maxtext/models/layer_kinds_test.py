"""A model mixing three layer kinds (dense MLP, experts, global attention
with its own head size and experts) against itself unrolled by hand:
logits and the sown MoE values, scanned and unscanned, through Hugging Face
weights, with a KV cache, and its FLOP count per kind."""


from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.layers import moe
from maxtext.layers import rope
from maxtext.metrics import flops
from maxtext.models import hf_weights
from maxtext.models import registry
from testing import trees

_L = 16  # Longer than the window (3).


def _cfg(**changes) -> ModelConfig:
  """10 layers: dense first, experts every 2nd, every 4th global with head
  dim 16 and 1 kv head (the others 8 and 2): a scanned run of 2 groups of
  [dense, experts, dense, global experts], then an unrolled [dense,
  experts]."""
  return ModelConfig.from_dict(dict(family="qwen3_moe", vocab_size=64,
                                    num_layers=10, embed_dim=32, mlp_dim=48,
                                    num_heads=4, num_kv_heads=2, head_dim=8,
                                    qk_norm=True, num_experts=4,
                                    num_experts_per_token=2, moe_mlp_dim=16,
                                    first_dense_layers=1, moe_layer_interval=2,
                                    sliding_window=3, global_layer_interval=4,
                                    global_head_dim=16, global_num_kv_heads=1,
                                    load_balance_loss_weight=0.1,
                                    router_bias=True,
                                    router_bias_update_rate=0.01, **changes))


def _tokens():
  return np.random.RandomState(0).randint(0, 64, size=(2, _L))


@nnx.jit
def _logits(model, tokens):
  return model(tokens)


@nnx.jit
def _captured(model, tokens):
  logits, aux, stats = nnx.capture(model, moe.AuxLoss, nnx.Intermediate)(
      tokens)
  return (logits, sum(jax.tree.leaves(aux)),
          nnx.to_pure_dict(stats)["expert_load"])


def _by_hand(model, tokens):
  """The unscanned model's layers called one by one in layer order."""
  cfg = model.cfg
  positions = jnp.broadcast_to(jnp.arange(_L), tokens.shape)
  x = model.embedder(tokens)
  counts, loss, loads = {}, 0.0, []
  for layer in layer_pattern.layers(cfg):
    name = layer.kind.name
    block = getattr(model, name)[counts.get(name, 0)]
    counts[name] = counts.get(name, 0) + 1
    kind_cfg = layer.kind.config(cfg)
    rotary = rope.Rotary.at(positions, kind_cfg.rope.global_inverse_frequencies(
        kind_cfg.attention.head_dim))
    x, _, aux, _ = block(x, rotary, window=layer.window, segment_ids_BL=None)
    if aux is not None:
      loss += aux["loss"]
      loads.append(aux["expert_load"])
  return model._logits(model.final_norm(x)), loss, loads


class LayerKindsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.unscanned = registry.create_model(_cfg(scan_layers=False),
                                          rngs=nnx.Rngs(0))
    cls.scanned = registry.create_model(_cfg(), rngs=nnx.Rngs(1))
    hf_weights.load_hf_weights(cls.scanned,
                               hf_weights.to_hf_weights(cls.unscanned))

  def test_each_kind_has_its_own_stack_and_sizes(self):
    model = self.scanned
    self.assertEqual(model.dense_blocks.mlp.down.kernel.shape, (5, 48, 32))
    self.assertIsNone(model.dense_blocks.moe)
    self.assertEqual(model.blocks.attention.key.kernel.shape, (3, 32, 2, 8))
    self.assertEqual(model.global_blocks.attention.key.kernel.shape,
                     (2, 32, 1, 16))
    self.assertEqual(model.global_blocks.attention.query.kernel.shape,
                     (2, 32, 4, 16))
    self.assertIsNone(model.global_blocks.mlp)

  def test_scanned_and_unscanned_equal_the_layers_by_hand(self):
    tokens = _tokens()
    want_logits, want_loss, want_loads = _by_hand(self.unscanned, tokens)
    expert_order = [i for i, layer in enumerate(layer_pattern.layers(_cfg()))
                    if layer.kind.experts]
    # Sown loads come kind by kind (blocks, then global_blocks).
    by_kind = sorted(range(len(expert_order)), key=lambda j: (
        layer_pattern.layers(_cfg())[expert_order[j]].kind.name != "blocks",
        j))
    for model in (self.unscanned, self.scanned):
      logits, loss, loads = _captured(model, tokens)
      trees.assert_close(logits, want_logits, rtol=1e-5, scaled_atol=1e-5)
      np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
      np.testing.assert_array_equal(
          loads, np.stack([want_loads[j] for j in by_kind]))

  def test_an_expert_kind_with_two_windows_sows_each_layer_once(self):
    # Local and global expert layers of the same sizes: one kind, two
    # windows (GPT-OSS); its layers' loss and loads count once each.
    cfg = _cfg(scan_layers=False).replace(
        global_head_dim=0, global_num_kv_heads=0,
        global_layer_interval=2, moe_layer_interval=1)
    self.assertEqual(
        {layer.window for layer in layer_pattern.layers(cfg)
         if layer.kind.experts}, {3, None})
    unscanned = registry.create_model(cfg, rngs=nnx.Rngs(3))
    scanned = registry.create_model(cfg.replace(scan_layers=True),
                                    rngs=nnx.Rngs(4))
    hf_weights.load_hf_weights(scanned, hf_weights.to_hf_weights(unscanned))
    tokens = _tokens()
    want_logits, want_loss, want_loads = _by_hand(unscanned, tokens)
    for model in (unscanned, scanned):
      logits, loss, loads = _captured(model, tokens)
      trees.assert_close(logits, want_logits, rtol=1e-5, scaled_atol=1e-5)
      np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
      np.testing.assert_array_equal(loads, np.stack(want_loads))

  def test_router_bias_moves_in_each_expert_kind(self):
    model = registry.create_model(_cfg(), rngs=nnx.Rngs(2))
    _, _, loads = _captured(model, _tokens())
    before = {name: np.asarray(getattr(model, name).moe.router_bias[...])
              for name in ("blocks", "global_blocks")}
    model.update_router_bias(loads)
    want = moe.update_router_bias(
        jnp.concatenate(list(before.values())), loads, 0.01)
    got = jnp.concatenate([getattr(model, name).moe.router_bias[...]
                           for name in before])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    self.assertGreater(float(jnp.abs(got - jnp.concatenate(
        list(before.values()))).max()), 0.0)

  def test_cached_decoding_equals_full_forward(self):
    model = self.scanned
    cache = model.init_cache(2, _L)
    self.assertEqual(cache["global_blocks"].key_BSGK.shape,
                     (2, 2, _L, 1, 16))
    self.assertEqual(cache["dense_blocks"].key_BSGK.shape, (5, 2, _L, 2, 8))
    tokens = _tokens()
    positions = np.broadcast_to(np.arange(_L), tokens.shape)

    @nnx.jit
    def step(model, tokens, positions, cache):
      return model(tokens, positions, cache=cache)

    logits, cache = step(model, tokens[:, :9], positions[:, :9], cache)
    got = [logits]
    for i in range(9, _L):
      logits, cache = step(model, tokens[:, i:i + 1], positions[:, i:i + 1],
                           cache)
      got.append(logits)
    trees.assert_close(np.concatenate(got, axis=1), _logits(model, tokens),
                       rtol=1e-5, atol=1e-4, scaled_atol=1e-5)

  def test_flops_count_every_kind_at_its_sizes(self):
    cfg = _cfg()
    model = self.unscanned
    params = 0  # Matmul kernels one token uses, counted from the model.
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
      names = [str(p) for p in path]
      size = int(np.prod(variable.shape))
      if names[-2:-1] == ["moe"] and names[-1] in ("gate", "up", "down"):
        params += size * cfg.moe.num_experts_per_token // cfg.moe.num_experts
      elif names[-1] == "kernel" and names[0] != "embedder":
        params += size  # Projections, MLPs, router, shared experts, head.
    if cfg.tie_embeddings:  # The output head is a matmul, tied or not.
      params += cfg.embed_dim * cfg.vocab_size
    self.assertEqual(flops.matmul_params(cfg), params)
    uniform = cfg.replace(global_head_dim=0,
                                  global_num_kv_heads=0)
    self.assertGreater(flops.matmul_params(cfg),
                       flops.matmul_params(uniform))


if __name__ == "__main__":
  absltest.main()
