"""OLMo 3: logits and weights equal Hugging Face's; what each feature does;
parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch

from configs import olmo3 as olmo3_config
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import hf_weights
from maxtext.models import olmo3
from maxtext.models import registry
from testing import hf_reference
from testing import hf_tiny_models

# Longer than the tiny model's window (5), so both layer kinds matter.
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _parameter_count(layers, embed, mlp, heads, kv_heads, head_dim=128,
                     vocab=100_278):
  """Parameters of an OLMo 3 config, counted independently of our model."""
  attention = (embed * (heads + 2 * kv_heads) * head_dim  # q, k, v kernels.
               + heads * head_dim * embed  # Output kernel.
               + (heads + kv_heads) * head_dim)  # q and k norms.
  block = attention + 3 * embed * mlp + 2 * embed  # MLP, two post-norms.
  return 2 * vocab * embed + layers * block + embed  # Untied; final norm.


class Olmo3HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model = hf_tiny_models.tiny_hf_model("olmo3")
    cls.cfg = olmo3.model_config_from_hf(cls.hf_model.config.to_dict())
    cls.state = hf_reference.state_dict(cls.hf_model)

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual((cfg.pre_norms, cfg.post_norms), (False, True))
    self.assertEqual((cfg.attention.qk_norm, cfg.attention.qk_norm_over),
                     (True, "projection"))
    self.assertEqual(cfg.layer_windows(), (5, 5, 5, None))
    self.assertFalse(cfg.tie_embeddings)

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_bfloat16_compute_stays_close(self):
    """bfloat16 activations (float32 parameters): within 3% of the largest
    logit of transformers' float32 model."""
    with torch.no_grad():
      scale = float(self.hf_model(torch.tensor(_TOKENS)).logits.abs().max())
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       dtype="bfloat16")
    self.assertLessEqual(diff, 0.03 * scale)

  def _logits(self, cfg, state):
    # Created with initial values: a variant may have parameters no Hugging
    # Face weight maps (with pre_norms, the MLP's input norm: ones).
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    hf_weights.load_hf_weights(model, state)
    return nnx.jit(lambda m, t: m(t))(model, jnp.asarray(_TOKENS))

  def test_each_feature_changes_the_logits(self):
    """Without it the logits differ, so the match above tests it."""
    # Unit q/k norm scales, so that a norm over each head alone loads too.
    state = {name: (np.ones_like(array) if name.endswith(("q_norm.weight",
                                                          "k_norm.weight"))
                    else array) for name, array in self.state.items()}
    want = self._logits(self.cfg, state)
    input_norms = {f"model.layers.{i}.input_layernorm.weight":
                   np.ones(64, np.float32) for i in range(4)}
    heads = {name: (array[:16] if name.endswith(("q_norm.weight",
                                                 "k_norm.weight")) else array)
             for name, array in state.items()}
    for feature, changes, changed_state in (
        ("the sliding window", dict(sliding_window=0,
                                    global_layer_interval=1), state),
        ("no input norms", dict(pre_norms=True), {**state, **input_norms}),
        ("q/k norms over the projection", dict(qk_norm_over="head"), heads)):
      got = self._logits(self.cfg.replace(**changes), changed_state)
      self.assertGreater(float(jnp.abs(got - want).max()), 1e-3, feature)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_published_yarn_attention_factor_is_read(self):
    # OLMo 3's config.json states YaRN's default attention factor.
    hf = {**self.hf_model.config.to_dict(), "rope_parameters": dict(
        rope_type="yarn", rope_theta=500_000.0, factor=8.0,
        original_max_position_embeddings=8192, beta_fast=32, beta_slow=1,
        attention_factor=1.2079441541679836)}
    cfg = olmo3.model_config_from_hf(hf)
    self.assertEqual((cfg.rope.scaling, cfg.rope.scaling_factor),
                     ("yarn", 8.0))
    hf["rope_parameters"]["attention_factor"] = 1.5
    with self.assertRaisesRegex(ValueError, "attention_factor=1.5"):
      olmo3.model_config_from_hf(hf)

  def test_unsupported_settings_are_named(self):
    base = self.hf_model.config.to_dict()
    for changes, pattern in ((dict(attention_bias=True), "attention_bias"),
                             (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
                             (dict(layer_types=["full_attention"] + [
                                 "sliding_attention"] * 3), "layer_types")):
      with self.subTest(pattern):
        with self.assertRaisesRegex(ValueError, pattern):
          olmo3.model_config_from_hf({**base, **changes})

  def test_a_block_needs_norms(self):
    with self.assertRaisesRegex(ValueError, "pre_norms.*post_norms=True"):
      self.cfg.replace(post_norms=False)


class Olmo3ParameterCountTest(parameterized.TestCase):

  @parameterized.parameters(
      ("7b", _parameter_count(32, 4096, 11_008, 32, 32), 7.30),
      ("32b", _parameter_count(64, 5120, 27_648, 40, 8), 32.23))
  def test_published_variant(self, variant, expected, billions):
    cfg = ModelConfig.from_dict(olmo3_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)
    self.assertEqual(round(count / 1e9, 2), billions)
    # The FLOP counter's matmul parameters: all but the embedding lookup
    # and the norm scales.
    norms = cfg.num_layers * (2 * cfg.embed_dim + (
        cfg.attention.num_heads + cfg.attention.num_kv_heads) *
                              cfg.attention.head_dim) + cfg.embed_dim
    self.assertEqual(flops.matmul_params(cfg),
                     count - cfg.vocab_size * cfg.embed_dim - norms)


if __name__ == "__main__":
  absltest.main()
