"""Gemma 3: logits equal Hugging Face's; config mapping; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import gemma3 as gemma3_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import gemma3
from maxtext.models import registry
from testing import hf_reference

# Tiny, but with everything Gemma 3 has: 8 layers = one scanned group of
# 5 local + 1 global and 2 unrolled local layers; window 5 < length 16;
# GQA; query_pre_attn_scalar != head_dim; linear rope scaling.
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    query_pre_attn_scalar=24, sliding_window=5, max_position_embeddings=64,
    rope_scaling=dict(rope_type="linear", factor=8.0))
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _hf_model(**changes):
  config = transformers.Gemma3TextConfig(**{**_HF_CONFIG, **changes})
  return config, hf_reference.random_hf_model(
      transformers.Gemma3ForCausalLM, config, norm_mean=0.0)


class Gemma3HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf_config, cls.hf_model = _hf_model()
    cls.cfg = gemma3.model_config_from_hf(hf_config.to_dict())

  @parameterized.product(scan_layers=(True, False),
                         attention_impl=("reference", "xla"))
  def test_logits_match(self, scan_layers, attention_impl):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       attention_impl=attention_impl)
    self.assertLessEqual(diff, _TOLERANCE)

  def test_softcaps_match_gemma2(self):
    # Hugging Face's Gemma 3 port ignores attn_logit_softcapping, so Gemma 2
    # (the same blocks without q/k norm, local and global layers
    # alternating, one rotary base) is the reference for both soft-caps.
    hf_config = transformers.Gemma2Config(
        **{**_HF_CONFIG, "rope_scaling": None}, attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0, attn_implementation="eager")
    hf_model = hf_reference.random_hf_model(transformers.Gemma2ForCausalLM,
                                            hf_config, norm_mean=0.0)
    cfg = self.cfg.replace(
        qk_norm=False, global_layer_interval=2, rope_theta=1e4,
        rope_scaling="default", rope_scaling_factor=1.0,
        attn_logit_softcap=5.0, final_logit_softcap=3.0)
    for scan_layers in (True, False):
      diff = hf_reference.max_logit_diff(hf_model, cfg, _TOKENS,
                                         scan_layers=scan_layers)
      self.assertLessEqual(diff, _TOLERANCE)

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual(cfg.layer_windows(), (5,) * 5 + (None,) + (5,) * 2)
    self.assertEqual((cfg.rope.scaling, cfg.rope.scaling_factor),
                     ("linear", 8.0))
    self.assertEqual((cfg.rope.theta, cfg.rope.local_theta), (1e6, 1e4))
    self.assertEqual(cfg.attention.query_pre_attn_scalar, 24)

  def test_legacy_config_json_keys(self):
    legacy = {k: v for k, v in self.hf_model.config.to_dict().items()
              if k not in ("rope_parameters", "layer_types")}
    legacy.update(rope_theta=1e6, rope_local_base_freq=1e4,
                  rope_scaling=dict(rope_type="linear", factor=8.0),
                  sliding_window_pattern=6)
    self.assertEqual(gemma3.model_config_from_hf(legacy), self.cfg)

  def test_irregular_layer_types_are_rejected(self):
    hf = self.hf_model.config.to_dict()
    hf["layer_types"] = ["full_attention"] + ["sliding_attention"] * 7
    with self.assertRaisesRegex(ValueError, "layer_types"):
      gemma3.model_config_from_hf(hf)


class Gemma3ParameterCountTest(parameterized.TestCase):

  # 1b: the published count of google/gemma-3-1b-pt (text only).
  # 4b/12b/27b: the text decoder of google/gemma-3-{4b,12b,27b}-pt: the
  # published totals 4,300,079,472 / 12,187,325,040 / 27,432,406,640
  # (safetensors index total_size / 2 bytes) minus the SigLIP vision tower
  # (416,866,032) and the multimodal projector (1152 * hidden + 1152).
  @parameterized.parameters(
      ("1b", 999_885_952),
      ("4b", 4_300_079_472 - 416_866_032 - (1152 * 2560 + 1152)),
      ("12b", 12_187_325_040 - 416_866_032 - (1152 * 3840 + 1152)),
      ("27b", 27_432_406_640 - 416_866_032 - (1152 * 5376 + 1152)),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(gemma3_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)


if __name__ == "__main__":
  absltest.main()
