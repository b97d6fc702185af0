"""Llama 2: logits and weights equal Hugging Face's; parameter counts."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import torch
import transformers

from configs import llama2 as llama2_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import hf_weights
from maxtext.models import llama2
from maxtext.models import registry
from testing import hf_reference

# Tiny, with multi-head attention (as 7B and 13B) and an untied head.
_HF_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    rope_theta=10_000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


class Llama2HuggingFaceTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf_config = transformers.LlamaConfig(**_HF_CONFIG)
    cls.hf_model = hf_reference.random_hf_model(
        transformers.LlamaForCausalLM, hf_config, norm_mean=1.0)
    cls.cfg = llama2.model_config_from_hf(hf_config.to_dict())

  def test_config_mapping(self):
    cfg = self.cfg
    self.assertEqual(cfg.family, "llama2")
    self.assertEqual((cfg.attention.num_heads, cfg.attention.num_kv_heads,
                      cfg.attention.head_dim),
                     (4, 4, 16))
    self.assertEqual((cfg.rope.theta, cfg.rope.scaling), (1e4, "default"))
    self.assertFalse(cfg.tie_embeddings)

  @parameterized.parameters(True, False)
  def test_logits_match(self, scan_layers):
    diff = hf_reference.max_logit_diff(self.hf_model, self.cfg, _TOKENS,
                                       scan_layers=scan_layers)
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(True, False)
  def test_weights_round_trip(self, scan_layers):
    hf_reference.assert_round_trip(self.hf_model, self.cfg,
                                   scan_layers=scan_layers)

  @parameterized.product(torch_dtype=(torch.bfloat16, torch.float16),
                         param_dtype=("bfloat16", "float32"))
  def test_half_precision_torch_weights_load_exactly(self, torch_dtype,
                                                     param_dtype):
    # A bf16/fp16 checkpoint, converted by the caller with .float().numpy()
    # (numpy has no bfloat16), loads without changing a value wherever the
    # parameter dtype can hold it.
    state_dict = {name: tensor.to(torch_dtype).float().numpy()
                  for name, tensor in self.hf_model.state_dict().items()}
    cfg = self.cfg.replace(param_dtype=param_dtype)
    model = hf_weights.model_from_hf_weights(cfg, state_dict)
    exact = param_dtype == "float32" or torch_dtype == torch.bfloat16
    for name, array in hf_weights.to_hf_weights(model).items():
      self.assertEqual(array.dtype, np.dtype(param_dtype))
      want = state_dict[name]
      if not exact:  # fp16 -> bf16 rounds.
        want = want.astype(array.dtype)
      np.testing.assert_array_equal(array.astype(np.float32), want,
                                    err_msg=name)


class Llama2ParameterCountTest(parameterized.TestCase):

  # Published counts of meta-llama/Llama-2-{7b,13b,70b}-hf.
  @parameterized.parameters(
      ("7b", 6_738_415_616),
      ("13b", 13_015_864_320),
      ("70b", 68_976_648_192),
  )
  def test_published_variant(self, variant, expected):
    cfg = ModelConfig.from_dict(llama2_config.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(count, expected)


if __name__ == "__main__":
  absltest.main()
