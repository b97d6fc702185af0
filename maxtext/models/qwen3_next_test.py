"""Qwen3-Next, Qwen3.5 and Qwen3.5 MoE: logits equal transformers' past the
delta rule's chunk (scanned and not, several chunk sizes); configs and
weights round-trip; the published sizes' parameter counts; a tiny Qwen3-Next
trains on CPU."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import transformers

from configs import qwen3_5 as qwen3_5_config
from configs import qwen3_5_moe as qwen3_5_moe_config
from configs import qwen3_next as qwen3_next_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import qwen3_5
from maxtext.models import qwen3_5_moe
from maxtext.models import qwen3_next
from maxtext.models import registry
from testing import hf_reference
from testing import tiny_configs

# Two Gated DeltaNet layers (2 key heads, 4 value heads), a full attention
# layer, another Gated DeltaNet layer.
_SIZES = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=12, linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "linear_attention", "full_attention",
                 "linear_attention"],
    max_position_embeddings=256, rms_norm_eps=1e-6)
_MOE = dict(moe_intermediate_size=32, shared_expert_intermediate_size=48,
            num_experts=8, num_experts_per_tok=3)
# family -> (config class, model class, family module, config changes).
_FAMILIES = {
    "qwen3_next": (transformers.Qwen3NextConfig,
                   transformers.Qwen3NextForCausalLM, qwen3_next,
                   dict(_MOE, intermediate_size=96)),
    "qwen3_5": (transformers.Qwen3_5TextConfig,
                transformers.Qwen3_5ForCausalLM, qwen3_5,
                dict(intermediate_size=96)),
    "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig,
                    transformers.Qwen3_5MoeForCausalLM, qwen3_5_moe, _MOE),
}
# 150 tokens: past two chunks of 64, not a multiple of any chunk below.
_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 150))
_TOLERANCE = 1e-4


def _hf(family):
  config_class, model_class, module, changes = _FAMILIES[family]
  config = config_class(**_SIZES, **changes)
  return (hf_reference.random_hf_model(model_class, config, norm_mean=0.0),
          module.model_config_from_hf(config.to_dict()))


class HuggingFaceTest(parameterized.TestCase):

  @parameterized.parameters(("qwen3_next", True, 64),
                            ("qwen3_next", False, 16),
                            ("qwen3_5", True, 64), ("qwen3_5_moe", False, 64))
  def test_logits_match(self, family, scan_layers, chunk):
    hf_model, cfg = _hf(family)
    diff = hf_reference.max_logit_diff(hf_model, cfg, _TOKENS,
                                       scan_layers=scan_layers,
                                       linear_chunk=chunk)
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(*_FAMILIES)
  def test_config_and_weights_round_trip(self, family):
    hf_model, cfg = _hf(family)
    module = registry.family_module(family)
    self.assertEqual(cfg.linear_attention.full_attention_interval, 3)
    self.assertEqual(cfg.rope.partial_factor, 0.25)
    self.assertEqual(module.model_config_from_hf(
        module.hf_config_from_model_config(cfg)), cfg)
    hf_reference.assert_round_trip(hf_model, cfg,
                                   scan_layers=family == "qwen3_next")

  def test_irregular_layer_types_are_rejected(self):
    hf = transformers.Qwen3NextConfig(**_SIZES, **_MOE).to_dict()
    hf["layer_types"] = ["full_attention", "linear_attention",
                         "linear_attention", "full_attention"]
    with self.assertRaisesRegex(ValueError, "not one full attention"):
      qwen3_next.model_config_from_hf(hf)


class ParameterCountTest(parameterized.TestCase):

  # Model cards: Qwen3-Next-80B-A3B 80B total (its multi-token prediction
  # module aside); Qwen3.5 9B, 27B, 35B-A3B and 397B-A17B with their vision
  # towers, which this text model lacks.
  @parameterized.parameters((qwen3_next_config, "80b-a3b", 79.67),
                            (qwen3_5_config, "9b", 8.95),
                            (qwen3_5_config, "27b", 26.90),
                            (qwen3_5_moe_config, "35b-a3b", 34.66),
                            (qwen3_5_moe_config, "397b-a17b", 396.35))
  def test_published_variant(self, config_module, variant, billions):
    cfg = ModelConfig.from_dict(config_module.get_config(variant).model)
    model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                         rngs=nnx.Rngs(0)))
    count = sum(math.prod(p.shape) for p in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
    self.assertEqual(round(count / 1e9, 2), billions)


class TrainTest(absltest.TestCase):

  def test_tiny_qwen3_next_loss_falls(self):
    cfg = tiny_configs.tiny_model_config("qwen3_next", window=4)
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    tokens = jax.random.randint(jax.random.key(0), (4, 33), 0,
                                cfg.vocab_size)

    @nnx.jit
    def step(model, optimizer):
      def loss_fn(model):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, tokens[:, 1:]).mean()
      loss, grads = nnx.value_and_grad(loss_fn)(model)
      optimizer.update(model, grads)
      return loss

    losses = [float(step(model, optimizer)) for _ in range(20)]
    self.assertLess(losses[-1], 0.7 * losses[0])
    self.assertTrue(all(np.isfinite(losses)))


if __name__ == "__main__":
  absltest.main()
