"""Llama 4 (text): logits and weights equal Hugging Face's; what each feature
does; the config mapping; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch

from configs import llama4 as llama4_config
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import hf_weights
from maxtext.models import llama4
from maxtext.models import registry
from testing import hf_reference
from testing import hf_tiny_models

# 16 tokens: four chunks of 4 on the chunked layers; the NoPE layer's
# temperature (floor scale 4) grows from position 3 on.
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _parameter_count(layers, moe_interval, experts, vocab=202_048,
                     embed=5120, heads=40, kv_heads=8, head_dim=128,
                     expert_mlp=8192, dense_mlp=16_384):
  """Parameters of a Llama 4 text config, counted independently of our
  model."""
  attention = embed * (2 * heads + 2 * kv_heads) * head_dim
  moe = embed * experts + 3 * embed * expert_mlp * (experts + 1)
  moe_layers = layers // moe_interval
  blocks = (layers * (attention + 2 * embed) + moe_layers * moe +
            (layers - moe_layers) * 3 * embed * dense_mlp)
  return 2 * vocab * embed + blocks + embed  # Untied; final norm.


class Llama4HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model = hf_tiny_models.tiny_hf_model("llama4")
    cls.cfg = llama4.model_config_from_hf(cls.hf_model.config.to_dict())
    cls.state = hf_reference.state_dict(cls.hf_model)

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual(cfg.pattern.chunks(4), (4, 4, 4, None))
    self.assertEqual(cfg.layer_windows(), (None,) * 4)
    self.assertEqual([cfg.moe_layer(i) for i in range(4)],
                     [False, True, False, True])
    self.assertEqual([layer.kind.name for layer in layer_pattern.layers(cfg)],
                     ["dense_blocks", "blocks"] * 2)
    self.assertEqual((cfg.mlp.dim, cfg.moe.mlp_dim), (96, 32))
    self.assertTrue(cfg.rope.global_nope and cfg.rope.interleaved)
    self.assertTrue(cfg.attention.qk_l2_norm)
    self.assertEqual((cfg.attention.temperature_scale,
                      cfg.attention.temperature_floor_scale), (0.5, 4))
    self.assertEqual((cfg.moe.router_score, cfg.moe.router_normalize,
                      cfg.moe.weights_on_input, cfg.moe.num_shared_experts),
                     ("sigmoid", False, True, 1))
    self.assertEqual(llama4.hf_config_from_model_config(cfg)["layer_types"],
                     self.hf_model.config.layer_types)

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_packed_documents_restart_their_chunks(self):
    """Two documents packed in one row give each one's logits alone: the
    chunks and the temperature follow each document's positions."""
    model = hf_weights.model_from_hf_weights(self.cfg, self.state)
    first, second = _TOKENS[0, :7], _TOKENS[1, :9]
    packed = np.concatenate([first, second])[None]
    segments = np.array([[1] * 7 + [2] * 9])
    positions = np.array([list(range(7)) + list(range(9))])
    got = nnx.jit(lambda m, t, s, p: m(t, segment_ids_BL=s, positions_BL=p))(
        model, jnp.asarray(packed), jnp.asarray(segments),
        jnp.asarray(positions))
    with torch.no_grad():
      want = np.concatenate([self.hf_model(torch.tensor(doc[None])).logits[0]
                             for doc in (first, second)])
    self.assertLessEqual(float(np.abs(np.asarray(got[0]) - want).max()),
                         _TOLERANCE)

  def test_bfloat16_compute_stays_close(self):
    """bfloat16 activations (float32 parameters): within 3% of the largest
    logit of transformers' float32 model."""
    with torch.no_grad():
      scale = float(self.hf_model(torch.tensor(_TOKENS)).logits.abs().max())
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       dtype="bfloat16")
    self.assertLessEqual(diff, 0.03 * scale)

  def _logits(self, cfg, state):
    model = hf_weights.model_from_hf_weights(cfg, state)
    return nnx.jit(lambda m, t: m(t))(model, jnp.asarray(_TOKENS))

  def test_each_feature_changes_the_logits(self):
    """Without it the logits differ, so the match above tests it."""
    want = self._logits(self.cfg, self.state)
    for feature, changes in (
        ("chunked attention", dict(attention_chunk_size=64)),
        ("NoPE layers", dict(rope_global_nope=False,
                             attn_temperature_scale=0.0)),
        ("temperature tuning", dict(attn_temperature_scale=0.0)),
        ("interleaved rotary", dict(rope_interleaved=False)),
        ("q/k L2 norm", dict(qk_l2_norm=False)),
        ("expert weights on the inputs", dict(router_weights_on_input=False))):
      with self.subTest(feature):
        got = self._logits(self.cfg.replace(**changes), self.state)
        self.assertGreater(float(jnp.abs(got - want).max()), 1e-3)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_hf_config_round_trips(self):
    again = llama4.model_config_from_hf(
        llama4.hf_config_from_model_config(self.cfg))
    self.assertEqual(again, self.cfg)

  def test_unsupported_settings_are_named(self):
    base = self.hf_model.config.to_dict()
    for changes, pattern in (
        (dict(attention_bias=True), "attention_bias"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
        (dict(num_local_experts=0), "num_local_experts=0"),
        (dict(no_rope_layers=[1, 0, 0, 1], layer_types=None),
         "no_rope_layers"),
        (dict(layer_types=["full_attention"] * 4), "layer_types"),
        (dict(moe_layers=[0, 3]), "moe_layers"),
        (dict(attention_chunk_size=None), "attention_chunk_size=None")):
      with self.subTest(pattern):
        with self.assertRaisesRegex(ValueError, pattern):
          llama4.model_config_from_hf({**base, **changes})


class Llama4ParameterCountTest(parameterized.TestCase):

  @parameterized.parameters(
      ("scout", _parameter_count(48, 1, 16), 107.77),
      ("maverick", _parameter_count(48, 2, 128), 400.71))
  def test_published_variant(self, variant, expected, billions):
    cfg = ModelConfig.from_dict(llama4_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)
    self.assertEqual(round(count / 1e9, 2), billions)

  def test_chunked_layers_count_their_chunks(self):
    """Attention FLOPs: a chunked layer's query sees only its chunk."""
    cfg = ModelConfig.from_dict(llama4_config.get_config("scout").model)
    chunk, seq_len = 8192, 3 * 8192 + 100
    per_layer = 6 * 40 * 2 * 128
    full = (seq_len + 1) / 2
    chunked = (3 * chunk * (chunk + 1) / 2 + 100 * 101 / 2) / seq_len
    self.assertAlmostEqual(
        flops.attention_flops_per_token(cfg, seq_len),
        per_layer * (12 * full + 36 * chunked), delta=1.0)


if __name__ == "__main__":
  absltest.main()
