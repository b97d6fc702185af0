"""Tests of the Hugging Face weight mapping (no torch needed)."""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.models import hf_weights
from maxtext.models import registry

_SIZES = dict(vocab_size=32, num_layers=3, embed_dim=16, mlp_dim=24,
              num_heads=4, num_kv_heads=2, head_dim=8)
_CONFIGS = {
    "gemma3": ModelConfig(family="gemma3", **_SIZES, norm_offset=1.0,
                          post_norms=True, qk_norm=True, sliding_window=4,
                          global_layer_interval=2),
    "llama3": ModelConfig(family="llama3", **_SIZES, tie_embeddings=False),
}


def _model(family, scan_layers, seed=0):
  cfg = ModelConfig(**{**vars(_CONFIGS[family]), "scan_layers": scan_layers})
  return registry.create_model(cfg, rngs=nnx.Rngs(seed))


class HfWeightsTest(parameterized.TestCase):

  @parameterized.product(family=tuple(_CONFIGS), scan_layers=(True, False))
  def test_round_trip_restores_every_parameter(self, family, scan_layers):
    source = _model(family, scan_layers, seed=0)
    target = _model(family, scan_layers, seed=1)
    hf_weights.load_hf_weights(target, hf_weights.to_hf_weights(source))
    jax.tree.map(np.testing.assert_array_equal,
                 nnx.state(source, nnx.Param), nnx.state(target, nnx.Param))

  @parameterized.parameters(True, False)
  def test_hugging_face_names_and_shapes(self, scan_layers):
    state_dict = hf_weights.to_hf_weights(_model("llama3", scan_layers))
    shapes = {name: array.shape for name, array in state_dict.items()}
    self.assertLen(shapes, 3 + 3 * 9)
    self.assertEqual(shapes["model.embed_tokens.weight"], (32, 16))
    self.assertEqual(shapes["lm_head.weight"], (32, 16))
    self.assertEqual(shapes["model.layers.2.self_attn.q_proj.weight"],
                     (32, 16))
    self.assertEqual(shapes["model.layers.2.self_attn.k_proj.weight"],
                     (16, 16))
    self.assertEqual(shapes["model.layers.0.self_attn.o_proj.weight"],
                     (16, 32))
    self.assertEqual(shapes["model.layers.1.mlp.down_proj.weight"], (16, 24))
    self.assertEqual(shapes["model.layers.1.post_attention_layernorm.weight"],
                     (16,))

  def test_query_rows_are_head_major(self):
    model = _model("llama3", scan_layers=False)
    q_DHK = np.asarray(model.blocks[0].attention.query.kernel[...])
    q_hf = hf_weights.to_hf_weights(model)[
        "model.layers.0.self_attn.q_proj.weight"]
    # Row h * head_dim + k of the torch weight is our [:, h, k].
    np.testing.assert_array_equal(q_hf[2 * 8 + 5], q_DHK[:, 2, 5])

  def test_missing_weight_is_named(self):
    state_dict = hf_weights.to_hf_weights(_model("gemma3", True))
    del state_dict["model.layers.1.self_attn.k_norm.weight"]
    with self.assertRaisesRegex(KeyError, "layers.1.self_attn.k_norm"):
      hf_weights.load_hf_weights(_model("gemma3", True), state_dict)

  def test_unexpected_weight_is_named(self):
    state_dict = hf_weights.to_hf_weights(_model("llama3", False))
    state_dict["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32)
    with self.assertRaisesRegex(ValueError, "q_proj.bias"):
      hf_weights.load_hf_weights(_model("llama3", False), state_dict)

  def test_tied_model_ignores_lm_head(self):
    model = _model("gemma3", True)
    state_dict = hf_weights.to_hf_weights(model)
    self.assertNotIn("lm_head.weight", state_dict)
    state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
    hf_weights.load_hf_weights(model, state_dict)

  def test_wrong_shape_is_reported(self):
    state_dict = hf_weights.to_hf_weights(_model("llama3", True))
    state_dict["model.layers.0.mlp.up_proj.weight"] = np.zeros((3, 16))
    with self.assertRaisesRegex(ValueError, "up_proj.*does not fit"):
      hf_weights.load_hf_weights(_model("llama3", True), state_dict)


if __name__ == "__main__":
  absltest.main()
