"""Gemma 2: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import transformers

from configs import gemma2 as gemma2_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import gemma2
from maxtext.models import registry
from testing import hf_reference

# Tiny, with everything Gemma 2 has: 5 layers = two scanned local/global
# pairs and one unrolled local layer; window 5 < length 16; GQA;
# query_pre_attn_scalar != head_dim; soft-caps small enough to bite.
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    query_pre_attn_scalar=24, sliding_window=5, max_position_embeddings=64,
    attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
    attn_implementation="eager")
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


class Gemma2HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf_config = transformers.Gemma2Config(**_HF_CONFIG)
    cls.hf_model = hf_reference.random_hf_model(
        transformers.Gemma2ForCausalLM, hf_config, norm_mean=0.0)
    cls.cfg = gemma2.model_config_from_hf(hf_config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual(cfg.layer_windows(), (5, None, 5, None, 5))
    self.assertEqual(cfg.rope.local_theta, cfg.rope.theta)
    self.assertEqual((cfg.attention.logit_softcap, cfg.final_logit_softcap),
                     (5.0, 3.0))
    self.assertEqual(cfg.attention.query_pre_attn_scalar, 24)
    self.assertTrue(cfg.post_norms)

  def test_config_json_without_layer_types_alternates(self):
    hf = {k: v for k, v in self.hf_model.config.to_dict().items()
          if k != "layer_types"}
    self.assertEqual(gemma2.model_config_from_hf(hf), self.cfg)

  @parameterized.parameters(True, False)
  def test_logits_match(self, scan_layers):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers)
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(
      dict(sliding_window=0, global_layer_interval=1),
      dict(attn_logit_softcap=0.0),
      dict(final_logit_softcap=0.0),
  )
  def test_each_feature_matters(self, **off):
    # Guards the parity test: turning one feature off changes our logits.
    cfg = self.cfg.replace(**off)
    self.assertGreater(
        hf_reference.max_logit_diff(self.hf_model, cfg, _TOKENS), 1e-2)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)


class Gemma2ParameterCountTest(parameterized.TestCase):

  # Published counts of google/gemma-2-{2b,9b,27b}.
  @parameterized.parameters(
      ("2b", 2_614_341_888),
      ("9b", 9_241_705_984),
      ("27b", 27_227_128_320),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(gemma2_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)


if __name__ == "__main__":
  absltest.main()
