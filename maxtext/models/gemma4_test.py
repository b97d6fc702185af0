"""Gemma 4 (text): logits and weights equal Hugging Face's; what each feature
does; the config mapping; parameter and FLOP counts."""

import copy
import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from configs import gemma4 as gemma4_config
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.inference import generate
from maxtext.metrics import flops
from maxtext.models import gemma4
from maxtext.models import hf_weights
from maxtext.models import registry
from testing import hf_reference
from testing import hf_tiny_models

# 16 tokens: past the local layers' window of 5.
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4
# 26b-a4b's MoE block, tiny.
_MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2,
            moe_intermediate_size=32)
_LOCAL, _GLOBAL = "sliding_attention", "full_attention"
# e2b's layers, tiny: two local layers per global one, per-layer inputs 8
# wide; the last three layers (two local, one global) read the keys and
# values of layers 4 and 5, their MLP twice as wide.
_E2B = dict(num_hidden_layers=9, layer_types=[_LOCAL, _LOCAL, _GLOBAL] * 3,
            attention_k_eq_v=False, hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=128, num_kv_shared_layers=3,
            use_double_wide_mlp=True)


def _logits(cfg, state):
  model = hf_weights.model_from_hf_weights(cfg, state)
  return nnx.jit(lambda m, t: m(t))(model, jnp.asarray(_TOKENS))


def _parameter_count(layers=60, interval=6, vocab=262_144, embed=5376,
                     mlp=21_504, heads=32, kv_heads=16, head_dim=256,
                     global_kv_heads=4, global_head_dim=512, experts=0,
                     top_k=0, moe_mlp=0):
  """(parameters, matmul parameters one token uses) of a Gemma 4 text
  config with values equal to keys on global layers and, with `experts`,
  the MoE block next to the MLP in every layer, counted independently of
  our model."""
  local = embed * (2 * heads + 2 * kv_heads) * head_dim + 3 * embed * mlp
  full = (embed * (2 * heads + global_kv_heads) * global_head_dim +
          3 * embed * mlp)
  num_global = layers // interval
  dense = (layers - num_global) * local + num_global * full
  # The router's projection, and all experts or one token's.
  every_expert, used = (layers * embed * (experts + n * 3 * moe_mlp)
                        for n in (experts, top_k))
  # Four norms of embed, q and k norms of the head width, the scalar; with
  # experts three more norms and the router's scales [embed], [experts].
  small = (layers * (4 * embed + 1) + (layers - num_global) * 2 * head_dim +
           num_global * 2 * global_head_dim)
  if experts:
    small += layers * (4 * embed + experts)
  # Tied embedding (the head's matmul), the final norm.
  return (vocab * embed + dense + every_expert + small + embed,
          dense + used + vocab * embed)


def _tiny(**changes):
  """(transformers' tiny Gemma 4 with `changes`, our config of it, its
  state dict)."""
  hf_model = hf_tiny_models.tiny_hf_model("gemma4", **changes)
  return (hf_model, gemma4.model_config_from_hf(hf_model.config.to_dict()),
          hf_reference.state_dict(hf_model))


def _assert_greedy_matches_transformers(test):
  """`test`'s model (its hf_model, cfg and state) decodes greedily, with the
  dense and the paged KV cache, to transformers' `generate` tokens."""
  prompts = [[5, 17, 99, 3, 42, 8, 64, 2], [11, 7, 120]]
  want = [hf_tiny_models.hf_greedy(test.hf_model, prompt, 8)
          for prompt in prompts]
  model = hf_weights.model_from_hf_weights(test.cfg, test.state)
  test.assertEqual(generate.generate(model, prompts, max_new_tokens=8), want)
  test.assertEqual(generate.generate(model, prompts, max_new_tokens=8,
                                     kv_cache="paged", page_size=4), want)


class Gemma4HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model, cls.cfg, cls.state = _tiny()

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual(cfg.layer_windows(), (5, 5, None))
    self.assertEqual([layer.kind.name for layer in layer_pattern.layers(cfg)],
                     ["blocks", "blocks", "global_blocks"])
    local, full = (layer_pattern.kinds(cfg)[0].config(cfg).attention,
                   layer_pattern.kinds(cfg)[1].config(cfg).attention)
    self.assertEqual((local.head_dim, local.num_kv_heads, local.k_eq_v),
                     (16, 2, False))
    self.assertEqual((full.head_dim, full.num_kv_heads, full.k_eq_v),
                     (32, 1, True))
    self.assertEqual((cfg.rope.theta, cfg.rope.local_theta,
                      cfg.rope.global_fraction), (1e6, 1e4, 0.25))
    self.assertEqual(cfg.attention.query_scale(16), 1.0)
    self.assertTrue(cfg.attention.value_norm and cfg.layer_scalar)
    self.assertEqual((cfg.norm.offset, cfg.final_logit_softcap), (0.0, 3.0))

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_global_layers_have_no_value_projection(self):
    """The global kind's values are its keys (transformers' global layers
    have no v_proj, so the match above holds only with them)."""
    model = registry.create_model(self.cfg, rngs=nnx.Rngs(0))
    self.assertIsNone(model.global_blocks.attention.value)
    self.assertIsNotNone(model.blocks.attention.value)
    self.assertNotIn("model.layers.2.self_attn.v_proj.weight", self.state)

  def test_bfloat16_compute_stays_close(self):
    """bfloat16 activations (float32 parameters) stay within twice the
    error of transformers' own bfloat16 model (both against its float32
    one): unscaled attention logits over normalized q and k make Gemma 4's
    rounding larger than other families' (4.4% of the largest logit for
    transformers here)."""
    tokens = torch.tensor(_TOKENS)
    with torch.no_grad():
      want = self.hf_model(tokens).logits
      hf_bf16 = copy.deepcopy(self.hf_model).to(torch.bfloat16)
      hf_error = float((hf_bf16(tokens).logits.float() - want).abs().max())
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       dtype="bfloat16")
    print(f"bfloat16: ours {diff:.4f}, transformers' {hf_error:.4f}, "
          f"max |logit| {float(want.abs().max()):.2f}")
    self.assertLessEqual(diff, 2 * hf_error)

  def test_each_feature_changes_the_logits(self):
    """Without it the logits differ, so the match above tests it."""
    want = _logits(self.cfg, self.state)
    unit_scalars = {name: (np.ones_like(value) if name.endswith("scalar")
                           else value) for name, value in self.state.items()}
    for feature, changes, state in (
        ("value norm", dict(attention_value_norm=False), self.state),
        ("proportional rotary", dict(rope_global_fraction=1.0), self.state),
        ("unscaled logits", dict(query_pre_attn_scalar=None), self.state),
        ("sliding window", dict(sliding_window=64), self.state),
        ("logit soft cap", dict(final_logit_softcap=0.0), self.state),
        ("layer scalars", {}, unit_scalars)):
      with self.subTest(feature):
        got = _logits(self.cfg.replace(**changes), state)
        self.assertGreater(float(jnp.abs(got - want).max()), 1e-3)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_hf_config_round_trips(self):
    hf = gemma4.hf_config_from_model_config(self.cfg)
    self.assertEqual(gemma4.model_config_from_hf(hf), self.cfg)
    self.assertEqual(hf["layer_types"], self.hf_model.config.layer_types)
    self.assertEqual(hf["rope_parameters"],
                     self.hf_model.config.rope_parameters)

  def test_unsupported_settings_are_named(self):
    base = self.hf_model.config.to_dict()
    for changes, pattern in (
        (dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=64),
         "vocab_size_per_layer_input=64: per-layer embeddings of another "
         "vocabulary"),
        (dict(num_kv_shared_layers=2), "kv_shared_layers=2 is invalid: "
         r"leaves no layer before layer 1 with the span \(global\)"),
        (dict(enable_moe_block=True, num_experts=4, top_k_experts=None,
              moe_intermediate_size=32), "top_k_experts=None"),
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(use_bidirectional_attention="all"),
         "use_bidirectional_attention='all'"),
        (dict(hidden_activation="silu"), "hidden_activation 'silu'"),
        (dict(layer_types=["sliding_attention", "full_attention",
                           "sliding_attention", "sliding_attention",
                           "full_attention"], num_hidden_layers=5),
         "not one global layer every N"),
        (dict(rope_parameters=dict(
            base["rope_parameters"],
            full_attention=dict(rope_type="default", rope_theta=1e6))),
         "rope_type 'default' with global_head_dim != head_dim")):
      with self.subTest(pattern):
        with self.assertRaisesRegex(ValueError, pattern):
          gemma4.model_config_from_hf({**base, **changes})

  def test_export_refuses_a_local_last_layer(self):
    with self.assertRaisesRegex(ValueError, "layer 3 is local"):
      gemma4.hf_config_from_model_config(self.cfg.replace(num_layers=4))


class Gemma4MoeTest(parameterized.TestCase):
  """26b-a4b's MoE block: top-2 of 4 experts next to the dense MLP in every
  layer (two local layers and a global one)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model, cls.cfg, cls.state = _tiny(**_MOE)

  def test_config_mapping(self):
    moe = self.cfg.moe
    self.assertEqual((moe.num_experts, moe.num_experts_per_token,
                      moe.mlp_dim, self.cfg.mlp.dim), (4, 2, 32, 96))
    self.assertTrue(moe.with_mlp and moe.router_input_norm and
                    moe.router_per_expert_scale and moe.expert_gate_up_fused)
    self.assertEqual([layer.kind.experts for layer in
                      layer_pattern.layers(self.cfg)], [True] * 3)

  @parameterized.product(scan_layers=(True, False),
                         moe_impl=("dropless", "dense"))
  def test_logits_match(self, scan_layers, moe_impl):
    diff = hf_reference.max_logit_diff(
        self.hf_model, self.cfg.replace(moe_impl=moe_impl), _TOKENS,
        scan_layers=scan_layers)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_each_feature_changes_the_logits(self):
    """Without it the logits differ, so the match above tests it."""
    want = _logits(self.cfg, self.state)
    for feature, changes, unused in (
        ("dense MLP next to the experts", dict(moe_with_mlp=False),
         ("mlp.", "layernorm_1", "layernorm_2")),
        ("router's own norm of the residual stream",
         dict(router_input_norm=False), ("router.scale",)),
        ("per-expert scales", dict(router_per_expert_scale=False),
         ("per_expert_scale",))):
      with self.subTest(feature):
        state = {name: value for name, value in self.state.items()
                 if not any(part in name for part in unused)}
        got = _logits(self.cfg.replace(**changes), state)
        self.assertGreater(float(jnp.abs(got - want).max()), 1e-3)
    for norm in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                 "post_feedforward_layernorm_2"):
      with self.subTest(norm):  # Each block norm weighs in.
        state = {name: np.ones_like(value) if norm in name else value
                 for name, value in self.state.items()}
        got = _logits(self.cfg, state)
        self.assertGreater(float(jnp.abs(got - want).max()), 1e-3)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_greedy_matches_transformers(self):
    """Greedy decoding with the dense and the paged KV cache gives
    transformers' `generate` tokens."""
    _assert_greedy_matches_transformers(self)

  def test_hf_config_round_trips(self):
    hf = gemma4.hf_config_from_model_config(self.cfg)
    self.assertEqual(gemma4.model_config_from_hf(hf), self.cfg)
    self.assertEqual({key: hf[key] for key in _MOE}, _MOE)

  def test_export_refuses_other_experts(self):
    for changes, pattern in (
        (dict(num_shared_experts=1), "num_shared_experts=1"),
        (dict(moe_layer_interval=3), "moe_layer_interval=3"),
        (dict(moe_with_mlp=False), "moe_with_mlp=False"),
        (dict(router_score="sigmoid"), "router_score='sigmoid'")):
      with self.subTest(pattern):
        with self.assertRaisesRegex(ValueError, pattern):
          gemma4.hf_config_from_model_config(self.cfg.replace(**changes))


class Gemma4SharedKvTest(parameterized.TestCase):
  """e2b and e4b: per-layer inputs, keys and values shared across the last
  layers, the double-wide MLP on those (`_E2B`)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model, cls.cfg, cls.state = _tiny(**_E2B)

  def test_config_mapping(self):
    cfg = self.cfg
    layers = layer_pattern.layers(cfg)
    self.assertEqual([layer.kind.name for layer in layers],
                     ["blocks", "blocks", "global_blocks"] * 2 +
                     ["shared_blocks", "shared_blocks",
                      "global_shared_blocks"])
    self.assertEqual([i for i, layer in enumerate(layers) if layer.stores_kv],
                     [4, 5])
    self.assertEqual((cfg.per_layer_input_dim, cfg.pattern.kv_shared_layers,
                      cfg.mlp.kv_shared_dim), (8, 3, 192))
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    for name in ("shared_blocks", "global_shared_blocks"):
      attention = getattr(model, name).attention
      self.assertIsNone(attention.key)
      self.assertIsNone(attention.value)
      self.assertIsNone(attention.key_norm)
    self.assertEqual(model.shared_blocks.mlp.up.kernel.shape, (2, 64, 192))
    cache = model.init_cache(1, 8)
    self.assertIsNone(cache["shared_blocks"])
    self.assertIsNone(cache["global_shared_blocks"])

  @parameterized.parameters(True, False)
  def test_logits_match(self, scan_layers):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_each_feature_changes_the_logits(self):
    """Without it the logits differ, so the match above tests it: the
    per-layer inputs, the double-wide MLP (its first half kept), and the
    sharing (the shared layers given their sources' key projections and
    norms, with the narrow MLP on both sides)."""
    want = _logits(self.cfg, self.state)
    no_inputs = {name: value for name, value in self.state.items()
                 if "per_layer" not in name}
    got = _logits(self.cfg.replace(per_layer_input_dim=0), no_inputs)
    self.assertGreater(float(jnp.abs(got - want).max()), 1e-3)
    narrow = dict(self.state)
    for layer in (6, 7, 8):
      for part in ("gate_proj", "up_proj"):
        name = f"model.layers.{layer}.mlp.{part}.weight"
        narrow[name] = narrow[name][:96]
      name = f"model.layers.{layer}.mlp.down_proj.weight"
      narrow[name] = narrow[name][:, :96]
    shared_narrow = _logits(self.cfg.replace(mlp_kv_shared_dim=0), narrow)
    self.assertGreater(float(jnp.abs(shared_narrow - want).max()), 1e-3)
    own = dict(narrow)
    for layer, source in ((6, 4), (7, 4), (8, 5)):
      for part in ("k_proj", "v_proj", "k_norm"):
        own[f"model.layers.{layer}.self_attn.{part}.weight"] = (
            self.state[f"model.layers.{source}.self_attn.{part}.weight"])
    got = _logits(self.cfg.replace(kv_shared_layers=0, mlp_kv_shared_dim=0),
                  own)
    self.assertGreater(float(jnp.abs(got - shared_narrow).max()), 1e-3)

  def test_released_weights_of_shared_layers_are_skipped(self):
    """The released checkpoints keep k/v projections and norms on the
    shared layers, which transformers ignores; so does the loader."""
    extra = dict(self.state)
    for layer in (6, 7, 8):
      for part, shape in (("k_proj", (32, 64)), ("v_proj", (32, 64)),
                          ("k_norm", (16,)), ("v_norm", (16,))):
        extra[f"model.layers.{layer}.self_attn.{part}.weight"] = np.ones(
            shape, np.float32)
    np.testing.assert_array_equal(_logits(self.cfg, extra),
                                  _logits(self.cfg, self.state))

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_greedy_matches_transformers(self):
    """Greedy decoding with the dense and the paged KV cache (the shared
    layers reading their sources' caches) gives transformers' tokens."""
    _assert_greedy_matches_transformers(self)

  def test_hf_config_round_trips(self):
    hf = gemma4.hf_config_from_model_config(self.cfg)
    self.assertEqual(gemma4.model_config_from_hf(hf), self.cfg)
    self.assertEqual({key: hf[key] for key in _E2B if key != "layer_types"},
                     {key: value for key, value in _E2B.items()
                      if key != "layer_types"})
    with self.assertRaisesRegex(ValueError, "mlp_kv_shared_dim=100.*use 0 "
                                "or 192"):
      gemma4.hf_config_from_model_config(
          self.cfg.replace(mlp_kv_shared_dim=100))


def _hf_counts(cfg):
  """(parameters, matmul parameters per token) of transformers' own
  Gemma4ForCausalLM of `cfg` (built without memory): its torch `Linear`
  weights are the matmuls (the tied head included)."""
  config = transformers.Gemma4TextConfig(
      **gemma4.hf_config_from_model_config(cfg))
  with torch.device("meta"):
    hf_model = transformers.Gemma4ForCausalLM(config)
  params = sum(p.numel() for p in hf_model.parameters())
  matmuls = sum(module.weight.numel() for module in hf_model.modules()
                if isinstance(module, torch.nn.Linear))
  return params, matmuls


class Gemma4ParameterCountTest(parameterized.TestCase):

  @parameterized.parameters(("e2b", 4.63, 1.88), ("e4b", 7.46, 3.97))
  def test_e2b_e4b(self, variant, billions, without_embeddings):
    """google/gemma-4-E2B and -E4B's text decoders: as many parameters as
    transformers' model of the same config, and FLOPs counting its matmuls
    (shared layers without k/v projections, the per-layer gates and
    projections). With their vision (~0.15B) and audio (~0.3B) encoders
    these are the published 5.1B and 8B; without the embedding tables the
    published "effective" 2.3B and 4.5B."""
    cfg = ModelConfig.from_dict(gemma4_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    # transformers keeps the per-layer scalars as buffers.
    self.assertEqual((count - cfg.num_layers, flops.matmul_params(cfg)),
                     _hf_counts(cfg))
    self.assertEqual(round(count / 1e9, 2), billions)
    tables = cfg.vocab_size * (cfg.embed_dim +
                               cfg.num_layers * cfg.per_layer_input_dim)
    self.assertEqual(round((count - tables) / 1e9, 2), without_embeddings)

  def test_31b(self):
    """google/gemma-4-31B's text decoder: 30.70B parameters; FLOPs count
    the global layers' missing value projections."""
    cfg = ModelConfig.from_dict(gemma4_config.get_config("31b").model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    expected, matmuls = _parameter_count()
    self.assertEqual(count, expected)
    self.assertEqual(round(count / 1e9, 2), 30.70)
    self.assertEqual(flops.matmul_params(cfg), matmuls)

  def test_26b_a4b(self):
    """google/gemma-4-26B-A4B's text decoder: 25.2B parameters, 3.8B of
    them used per token (FLOPs count 8 of the 128 experts, the router and
    the dense MLP next to them)."""
    cfg = ModelConfig.from_dict(gemma4_config.get_config("26b-a4b").model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    expected, used = _parameter_count(
        layers=30, embed=2816, mlp=2112, heads=16, kv_heads=8,
        global_kv_heads=2, experts=128, top_k=8, moe_mlp=704)
    self.assertEqual(count, expected)
    self.assertEqual(round(count / 1e9, 1), 25.2)
    self.assertEqual(flops.matmul_params(cfg), used)
    self.assertEqual(round(used / 1e9, 1), 3.8)


if __name__ == "__main__":
  absltest.main()
