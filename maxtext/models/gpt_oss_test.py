"""GPT-OSS: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch

from configs import gpt_oss as gpt_oss_config
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.models import gpt_oss
from maxtext.models import hf_weights
from maxtext.models import registry
from testing import hf_reference
from testing import hf_tiny_models

# Longer than the tiny model's window (5), so both layer kinds matter.
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _parameter_counts(layers, experts, embed=2880, mlp=2880, heads=64,
                      kv_heads=8, head_dim=64, vocab=201_088, per_token=4):
  """(total, active) parameters of a GPT-OSS config, counted by hand.

  Active, as in OpenAI's model card: what one token uses, the output head
  included, the embedding lookup not.
  """
  attention = (embed * (2 * heads + 2 * kv_heads) * head_dim  # Kernels.
               + (heads + 2 * kv_heads) * head_dim + embed  # Biases.
               + heads)  # Sinks.
  expert = 3 * embed * mlp + 2 * mlp + embed  # gate_up, down and biases.
  rest = attention + (embed + 1) * experts + 2 * embed  # Router, norms.
  head = vocab * embed + embed  # Output head, final norm.
  return (vocab * embed + head + layers * (rest + experts * expert),
          head + layers * (rest + per_token * expert))


class GptOssHuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model = hf_tiny_models.tiny_hf_model("gpt_oss")
    cls.cfg = gpt_oss.model_config_from_hf(cls.hf_model.config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual((cfg.moe.num_experts, cfg.moe.num_experts_per_token,
                      cfg.moe.mlp_dim), (4, 2, 96))
    self.assertEqual(cfg.layer_windows(), (5, None))
    self.assertEqual(
        [("full_attention" if w is None else "sliding_attention")
         for w in cfg.layer_windows()], self.hf_model.config.layer_types)
    self.assertEqual((cfg.rope.scaling, cfg.rope.scaling_factor,
                      cfg.rope.yarn_truncate, cfg.rope.local_theta),
                     ("yarn", 4.0, False, None))
    self.assertTrue(cfg.attention.sinks and cfg.attention.qkv_bias
                    and cfg.attention.output_bias)
    self.assertEqual(gpt_oss.model_config_from_hf(
        gpt_oss.hf_config_from_model_config(cfg)), cfg)

  # capacity_factor 2 = experts / per token: no token is ever dropped.
  @parameterized.parameters((True, "dropless"), (False, "dropless"),
                            (True, "capacity"), (True, "dense"))
  def test_logits_match(self, scan_layers, moe_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       moe_impl=moe_impl, capacity_factor=2.0)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_logits_match_past_the_swiglu_clamp(self):
    # Large expert weights push the gate and up projections past +-7.
    hf_model = hf_tiny_models.tiny_hf_model("gpt_oss")
    with torch.no_grad():
      for layer in hf_model.model.layers:
        layer.mlp.experts.gate_up_proj.mul_(20.0)
    hidden = hf_model.model.layers[0].post_attention_layernorm(
        hf_model.model.embed_tokens(torch.tensor(_TOKENS)))
    gate_up = hidden @ hf_model.model.layers[0].mlp.experts.gate_up_proj[0]
    self.assertGreater(int((gate_up.abs() > 7).sum()), 0)
    diff = hf_reference.max_logit_diff(hf_model, self.cfg, _TOKENS)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_window_sinks_and_yarn_matter(self):
    """Each feature changes the logits, so the match above tests it."""
    state = hf_reference.state_dict(self.hf_model)
    model = hf_weights.model_from_hf_weights(self.cfg, state)
    want = model(jnp.asarray(_TOKENS))
    for changes in (dict(sliding_window=0, global_layer_interval=1),
                    dict(attention_sinks=False),
                    dict(rope_scaling="default", rope_scaling_factor=1.0)):
      cfg = self.cfg.replace(**changes)
      other = hf_weights.model_from_hf_weights(cfg, {
          name: array for name, array in state.items()
          if cfg.attention.sinks or not name.endswith("sinks")})
      self.assertGreater(
          float(jnp.abs(other(jnp.asarray(_TOKENS)) - want).max()), 1e-3,
          changes)

  def test_packed_segments_match_separate_sequences(self):
    """Two sequences packed in one row equal transformers on each alone."""
    lengths = (9, 7)
    model = hf_weights.model_from_hf_weights(
        self.cfg, hf_reference.state_dict(self.hf_model))
    tokens = _TOKENS[:1]
    positions = np.concatenate([np.arange(n) for n in lengths])[None]
    segments = np.repeat([1, 2], lengths)[None]
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions),
                           jnp.asarray(segments)))
    start = 0
    for n in lengths:
      with torch.no_grad():
        want = self.hf_model(torch.tensor(tokens[:, start:start + n])).logits
      np.testing.assert_allclose(got[:, start:start + n], want.numpy(),
                                 atol=_TOLERANCE, rtol=0)
      start += n

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  def test_local_rotary_base_must_be_positive_or_none(self):
    with self.assertRaisesRegex(ValueError, "rope_local_theta.*None"):
      self.cfg.replace(rope_local_theta=0.0)

  def test_sliding_layers_need_a_window(self):
    hf = {**self.hf_model.config.to_dict(), "sliding_window": None}
    with self.assertRaisesRegex(ValueError, "sliding_window"):
      gpt_oss.model_config_from_hf(hf)


class GptOssParameterCountTest(parameterized.TestCase):

  @parameterized.parameters(("20b", _parameter_counts(24, 32)),
                            ("120b", _parameter_counts(36, 128)))
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(gpt_oss_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    total, active = expected
    self.assertEqual(count, total)
    # The FLOP counter's matmul parameters: the active ones without the
    # norm scales, biases and sinks.
    heads, kv_heads, head_dim, embed = 64, 8, 64, 2880
    per_layer = (2 * embed  # Norms.
                 + (heads + 2 * kv_heads) * head_dim + embed + heads
                 + cfg.moe.num_experts  # Router bias.
                 + 4 * (2 * cfg.moe.mlp_dim + embed))  # Expert biases.
    self.assertEqual(flops.matmul_params(cfg),
                     active - embed - cfg.num_layers * per_layer)

  def test_published_figures(self):
    # OpenAI's model card: 20b 20.91B total, 3.61B active; 120b 116.83B
    # total, 5.13B active (quoted as 21B/3.6B and 117B/5.1B).
    for (layers, experts), figures in (((24, 32), (20.91, 3.61)),
                                       ((36, 128), (116.83, 5.13))):
      total, active = _parameter_counts(layers, experts)
      self.assertEqual((round(total / 1e9, 2), round(active / 1e9, 2)),
                       figures)


if __name__ == "__main__":
  absltest.main()
