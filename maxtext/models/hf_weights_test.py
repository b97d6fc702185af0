"""Tests of the Hugging Face weight mapping (no torch needed)."""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.models import hf_weights
from maxtext.models import registry

_SIZES = dict(vocab_size=32, num_layers=3, embed_dim=16, mlp_dim=24,
              num_heads=4, num_kv_heads=2, head_dim=8)
_CONFIGS = {
    "gemma3": ModelConfig.from_dict(dict(family="gemma3", **_SIZES,
                                         norm_offset=1.0, post_norms=True,
                                         qk_norm=True, sliding_window=4,
                                         global_layer_interval=2)),
    "llama3": ModelConfig.from_dict(dict(family="llama3", **_SIZES,
                                         tie_embeddings=False)),
    "qwen2_5": ModelConfig.from_dict(dict(family="qwen2_5", **_SIZES,
                                          qkv_bias=True)),
    # Leading dense layer (`dense_blocks`), then experts.
    "mixtral": ModelConfig.from_dict(dict(family="mixtral", **_SIZES,
                                          tie_embeddings=False, num_experts=4,
                                          num_experts_per_token=2,
                                          moe_mlp_dim=8, first_dense_layers=1)),
    # MLA, a dense layer, experts and a multi-token prediction module.
    "deepseek3": ModelConfig.from_dict(dict(family="deepseek3",
                                            **{**_SIZES, "num_kv_heads": 4},
                                            tie_embeddings=False,
                                            attention_type="mla", q_lora_rank=8,
                                            kv_lora_rank=8, qk_nope_head_dim=4,
                                            v_head_dim=6, num_experts=4,
                                            num_experts_per_token=2,
                                            moe_mlp_dim=8, num_shared_experts=1,
                                            first_dense_layers=1,
                                            router_score="sigmoid",
                                            router_bias=True, mtp_layers=1)),
}


def _model(family, scan_layers, seed=0, **changes):
  cfg = _CONFIGS[family].replace(scan_layers=scan_layers, **changes)
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

  @parameterized.parameters(True, False)
  def test_first_dense_layers_are_the_first_hugging_face_layers(
      self, scan_layers):
    model = _model("mixtral", scan_layers)
    state_dict = hf_weights.to_hf_weights(model)
    dense = [n for n in state_dict if ".mlp.down_proj." in n]
    experts = {n.split(".")[2] for n in state_dict if ".experts." in n}
    self.assertEqual(dense, ["model.layers.0.mlp.down_proj.weight"])
    self.assertEqual(experts, {"1", "2"})
    # HF layer 0's tensors load into dense_blocks, layer 1's into blocks[0].
    state_dict["model.layers.0.mlp.up_proj.weight"] = np.full((24, 16), 2.0)
    state_dict["model.layers.1.input_layernorm.weight"] = np.full(16, 3.0)
    hf_weights.load_hf_weights(model, state_dict)
    if scan_layers:
      up, norm = (model.dense_blocks.mlp.up.kernel[0],
                  model.blocks.pre_attention_norm.scale[0])
    else:
      up, norm = (model.dense_blocks[0].mlp.up.kernel,
                  model.blocks[0].pre_attention_norm.scale)
    np.testing.assert_array_equal(up, np.full((16, 24), 2.0))
    np.testing.assert_array_equal(norm, np.full(16, 3.0))

  def test_multi_token_prediction_is_the_layer_after_the_last(self):
    model = _model("deepseek3", scan_layers=True)
    state_dict = hf_weights.to_hf_weights(model)
    mtp = {n for n in state_dict if n.startswith("model.layers.3.")}
    self.assertContainsSubset(
        {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight",
         "model.layers.3.hnorm.weight",
         "model.layers.3.shared_head.norm.weight",
         "model.layers.3.self_attn.kv_b_proj.weight",
         "model.layers.3.mlp.experts.3.up_proj.weight"}, mtp)
    self.assertEqual(state_dict["model.layers.3.eh_proj.weight"].shape,
                     (16, 32))
    # Its copies of the embedding and head are written, equal.
    np.testing.assert_array_equal(
        state_dict["model.layers.3.embed_tokens.weight"],
        state_dict["model.embed_tokens.weight"])
    np.testing.assert_array_equal(
        state_dict["model.layers.3.shared_head.head.weight"],
        state_dict["lm_head.weight"])
    # A model without prediction modules skips them.
    plain = _model("deepseek3", scan_layers=False, mtp_layers=0)
    with self.assertLogs(level="INFO") as logs:
      hf_weights.load_hf_weights(plain, state_dict)
    self.assertIn(f"Skipping {len(mtp)} Hugging Face weights", logs.output[0])
    self.assertNotIn("model.layers.3.enorm.weight",
                     hf_weights.to_hf_weights(plain))

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

  def test_biases_are_flat_in_hugging_face(self):
    model = _model("qwen2_5", scan_layers=True)
    state_dict = hf_weights.to_hf_weights(model)
    self.assertEqual(state_dict["model.layers.1.self_attn.q_proj.bias"].shape,
                     (32,))
    self.assertEqual(state_dict["model.layers.1.self_attn.k_proj.bias"].shape,
                     (16,))
    self.assertNotIn("model.layers.1.self_attn.o_proj.bias", state_dict)

  @parameterized.product(
      hf_dtype=(np.float16, jnp.bfloat16, np.float32, np.float64),
      param_dtype=("float32", "bfloat16"))
  def test_any_float_dtype_is_cast_to_the_parameter_dtype(self, hf_dtype,
                                                          param_dtype):
    # Values representable in float16 and bfloat16 (multiples of 1/64 below
    # 4), so every cast is exact and loaded == source.
    source = _model("llama3", True, seed=0, param_dtype=param_dtype)
    source_state = nnx.state(source, nnx.Param)
    rounded = jax.tree.map(
        lambda a: (np.round(np.asarray(a, np.float32) * 64) / 64).clip(-3, 3),
        source_state)
    nnx.update(source, rounded)
    state_dict = {name: array.astype(hf_dtype) for name, array in
                  hf_weights.to_hf_weights(source).items()}
    target = _model("llama3", True, seed=1, param_dtype=param_dtype)
    hf_weights.load_hf_weights(target, state_dict)
    for want, got in zip(jax.tree.leaves(nnx.state(source, nnx.Param)),
                         jax.tree.leaves(nnx.state(target, nnx.Param))):
      self.assertEqual(got.dtype, np.dtype(param_dtype))
      np.testing.assert_array_equal(np.asarray(got, np.float32),
                                    np.asarray(want, np.float32))

  def test_non_float_weight_is_rejected(self):
    state_dict = hf_weights.to_hf_weights(_model("llama3", True))
    state_dict["model.norm.weight"] = np.ones(16, np.int32)
    with self.assertRaisesRegex(TypeError, "model.norm.weight.*int32"):
      hf_weights.load_hf_weights(_model("llama3", True), state_dict)

  @parameterized.parameters(
      # transformers >= 4.52: Gemma3ForConditionalGeneration.
      dict(prefix="model.language_model.", head="lm_head.weight",
           vision=("model.vision_tower.vision_model.post_layernorm.weight",
                   "model.multi_modal_projector.mm_input_projection_weight")),
      # Earlier checkpoints (e.g. google/gemma-3-4b-pt on the Hub).
      dict(prefix="language_model.model.", head="language_model.lm_head.weight",
           vision=("vision_tower.vision_model.post_layernorm.weight",
                   "multi_modal_projector.mm_soft_emb_norm.weight")),
  )
  def test_multimodal_checkpoint_loads_its_text_decoder(self, prefix, head,
                                                        vision):
    source = _model("gemma3", True, seed=0)
    text = hf_weights.to_hf_weights(source)
    state_dict = {prefix + name[len("model."):]: array
                  for name, array in text.items()}
    state_dict[head] = text["model.embed_tokens.weight"]
    for name in vision:
      state_dict[name] = np.ones(4, np.float32)
    target = _model("gemma3", True, seed=1)
    hf_weights.load_hf_weights(target, state_dict)
    jax.tree.map(np.testing.assert_array_equal,
                 nnx.state(source, nnx.Param), nnx.state(target, nnx.Param))

  def test_two_names_of_one_weight_clash(self):
    text = hf_weights.to_hf_weights(_model("gemma3", True))
    state_dict = {"language_model." + name: array
                  for name, array in text.items()}
    state_dict["language_model.lm_head.weight"] = text[
        "model.embed_tokens.weight"]
    state_dict["lm_head.weight"] = text["model.embed_tokens.weight"]
    with self.assertRaisesRegex(ValueError, "both map to 'lm_head.weight'"):
      hf_weights.load_hf_weights(_model("gemma3", True), state_dict)


if __name__ == "__main__":
  absltest.main()
