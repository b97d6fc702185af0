"""HF checkpoint folder -> converted checkpoint -> HF folder, per family.

Each family: a tiny random `transformers` model is saved with
`save_pretrained` (sharded in the scanned case), converted, loaded from the
Orbax output and compared with transformers' logits; exported back, its
tensors must equal the originals bit for bit and `AutoModelForCausalLM` must
load it and give the same logits.
"""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax.numpy as jnp
import numpy as np
from safetensors import numpy as safetensors_numpy
import torch
import transformers

from maxtext.checkpoint import hf_convert
from maxtext.checkpoint import params_checkpoint
from maxtext.common.model_config import ModelConfig
from maxtext.models import registry
from testing import hf_reference
from testing import hf_tiny_models
from testing import tiny_configs

_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


def _hf_logits(hf_model: torch.nn.Module) -> np.ndarray:
  with torch.no_grad():
    return hf_model(torch.tensor(_TOKENS)).logits.numpy()


def _tensors(folder: str) -> dict[str, np.ndarray]:
  tensors = {}
  for name in sorted(os.listdir(folder)):
    if name.endswith(".safetensors"):
      tensors.update(safetensors_numpy.load_file(os.path.join(folder, name)))
  return tensors


def _read_json(folder: str, name: str) -> dict:
  with open(os.path.join(folder, name), encoding="utf-8") as f:
    return json.load(f)


class FamilyConversionTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(hf_tiny_models.FAMILIES))
  def test_hf_to_ours_to_hf(self, family):
    hf_model = hf_tiny_models.tiny_hf_model(family)
    want_logits = _hf_logits(hf_model)
    hf_dir = self.create_tempdir().full_path
    # A small shard size gives a sharded checkpoint with an index.
    hf_model.save_pretrained(hf_dir, max_shard_size="40KB")
    self.assertTrue(os.path.exists(
        os.path.join(hf_dir, "model.safetensors.index.json")))
    want_tensors = _tensors(hf_dir)
    for scan_layers in (True, False):
      with self.subTest(scan_layers=scan_layers):
        ours = self.create_tempdir().full_path
        hf_convert.hf_to_orbax(hf_dir, ours, scan_layers=scan_layers)

        cfg, params = params_checkpoint.load_converted(ours)
        self.assertEqual((cfg.family, cfg.scan_layers), (family, scan_layers))
        model = params_checkpoint.model_from_params(cfg, params)
        logits = nnx.jit(lambda m, t: m(t))(model, jnp.asarray(_TOKENS))
        diff = float(np.abs(np.asarray(logits) - want_logits).max())
        print(f"{family} scan_layers={scan_layers}: max |logit diff| = "
              f"{diff:.3g} (max |logit| {np.abs(want_logits).max():.3g})")
        self.assertLessEqual(diff, _TOLERANCE)

        back = self.create_tempdir().full_path
        files = hf_convert.orbax_to_hf(
            ours, back, max_shard_size="40KB" if scan_layers else "1GB")
        self.assertEqual(len(files) > 1, scan_layers)
        self.assertEqual(os.path.exists(
            os.path.join(back, "model.safetensors.index.json")), scan_layers)
        got_tensors = _tensors(back)
        self.assertEqual(sorted(got_tensors), sorted(want_tensors))
        for name, array in want_tensors.items():
          self.assertEqual(got_tensors[name].dtype, array.dtype, name)
          np.testing.assert_array_equal(got_tensors[name], array,
                                        err_msg=name)
        # Exported fields keep Hugging Face's types (newer transformers
        # releases reject e.g. a float where the config class wants an int).
        want_config, got_config = (_read_json(d, "config.json")
                                   for d in (hf_dir, back))
        for key in sorted(want_config.keys() & got_config.keys()):
          self.assertIsInstance(got_config[key], type(want_config[key]), key)
        reloaded = hf_tiny_models.with_fixes(
            transformers.AutoModelForCausalLM.from_pretrained(
                back, attn_implementation="eager").eval())
        self.assertIsInstance(reloaded, type(hf_model))
        np.testing.assert_allclose(_hf_logits(reloaded), want_logits,
                                   rtol=0, atol=1e-5)

  def test_bfloat16_storage(self):
    hf_model = hf_tiny_models.tiny_hf_model("qwen3")
    hf_dir = self.create_tempdir().full_path
    hf_model.save_pretrained(hf_dir)
    ours = self.create_tempdir().full_path
    cfg = hf_convert.hf_to_orbax(hf_dir, ours, dtype="bfloat16")
    self.assertEqual(cfg.param_dtype, "bfloat16")
    _, params = params_checkpoint.load_converted(ours)
    embedding = params["embedder"]["embedding"]
    self.assertEqual(embedding.dtype, jnp.bfloat16)
    want = hf_model.model.embed_tokens.weight.detach().to(torch.bfloat16)
    np.testing.assert_array_equal(np.asarray(embedding, np.float32),
                                  want.float().numpy())
    back = self.create_tempdir().full_path
    hf_convert.orbax_to_hf(ours, back)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(back)
    self.assertEqual(reloaded.dtype, torch.bfloat16)
    np.testing.assert_array_equal(
        reloaded.model.embed_tokens.weight.float().detach().numpy(),
        want.float().numpy())

  def test_tokenizer_files_travel_both_ways(self):
    hf_model = hf_tiny_models.tiny_hf_model("llama3")
    hf_dir = self.create_tempdir().full_path
    hf_model.save_pretrained(hf_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
      with open(os.path.join(hf_dir, name), "w", encoding="utf-8") as f:
        f.write(f'{{"file": "{name}"}}')
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
      original = json.load(f)
    ours = self.create_tempdir().full_path
    hf_convert.hf_to_orbax(hf_dir, ours)
    back = self.create_tempdir().full_path
    hf_convert.orbax_to_hf(ours, back)
    for name in ("tokenizer.json", "tokenizer_config.json"):
      with open(os.path.join(back, name), encoding="utf-8") as f:
        self.assertEqual(json.load(f), {"file": name})
    with open(os.path.join(back, "config.json"), encoding="utf-8") as f:
      exported = json.load(f)
    for key in ("bos_token_id", "eos_token_id"):
      self.assertEqual(exported[key], original[key])


class HfConfigTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(tiny_configs.CONFIG_MODULES))
  def test_config_round_trip(self, family):
    # The family's config file: our config -> config.json -> ours.
    module = registry.family_module(family)
    cfg = ModelConfig.from_dict(tiny_configs.CONFIG_MODULES[family].get_config().model)
    hf = json.loads(json.dumps(hf_convert.hf_config_dict(cfg)))
    # Whole-number fields stay ints: newer transformers releases reject e.g.
    # query_pre_attn_scalar=64.0 where the config class declares an int.
    defaults = transformers.AutoConfig.for_model(hf["model_type"]).to_dict()
    for key, value in hf.items():
      if type(defaults.get(key)) is int:  # pylint: disable=unidiomatic-typecheck
        self.assertIsInstance(value, int, key)
    self.assertEqual(hf["architectures"], [module.HF_ARCHITECTURE])
    self.assertIn(registry.family_from_hf_config(hf),
                  (family, "llama3"))  # Llama 2 loads as Llama 3.
    back = module.model_config_from_hf(hf)
    self.assertEqual(back.query_scale, cfg.query_scale)
    # Compute choices, and None vs head_dim for the scalar.
    ignored = ("dtype", "param_dtype", "scan_layers", "query_pre_attn_scalar")
    self.assertEqual(
        {k: v for k, v in back.to_dict().items() if k not in ignored},
        {k: v for k, v in cfg.to_dict().items() if k not in ignored})


def _tiny_multimodal_gemma3() -> torch.nn.Module:
  """A tiny random `Gemma3ForConditionalGeneration` (text decoder of the
  tiny gemma3 family, one-layer SigLIP vision tower)."""
  _, _, changes, _ = hf_tiny_models.FAMILIES["gemma3"]
  text = transformers.Gemma3TextConfig(**{**hf_tiny_models.SIZES, **changes})
  vision = transformers.SiglipVisionConfig(
      hidden_size=16, intermediate_size=32, num_hidden_layers=1,
      num_attention_heads=2, image_size=28, patch_size=14)
  config = transformers.Gemma3Config(
      text_config=text, vision_config=vision, mm_tokens_per_image=4,
      boi_token_index=125, eoi_token_index=126, image_token_index=127)
  return hf_reference.random_hf_model(
      transformers.Gemma3ForConditionalGeneration, config, norm_mean=0.0)


# Newer transformers' names of the multimodal weights (older: the keys).
_NEW_MULTIMODAL_PREFIXES = {
    "language_model.model.": "model.language_model.",
    "vision_tower.": "model.vision_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
}


class MultimodalGemma3Test(parameterized.TestCase):
  """`Gemma3ForConditionalGeneration` folders, under each naming, convert
  whole (the text decoder, the vision tower and projector; the tower's
  unused pooling head skipped) and export as they came."""

  @parameterized.named_parameters(
      ("older_names", False, None),
      ("older_names_lm_head", False, "language_model.lm_head.weight"),
      ("newer_names_lm_head", True, "lm_head.weight"))
  def test_converts_whole(self, newer_names, lm_head):
    hf_model = _tiny_multimodal_gemma3()
    # Text-only tokens (no image / begin / end-of-image tokens).
    tokens = _TOKENS % 120
    with torch.no_grad():
      want_logits = hf_model(input_ids=torch.tensor(tokens)).logits.numpy()
    hf_dir = self.create_tempdir().full_path
    hf_model.save_pretrained(hf_dir)
    path = os.path.join(hf_dir, "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    if newer_names:
      renamed = {}
      for name, array in tensors.items():
        for old, new in _NEW_MULTIMODAL_PREFIXES.items():
          if name.startswith(old):
            name = new + name[len(old):]
            break
        renamed[name] = array
      tensors = renamed
    embedding_name = ("model.language_model.embed_tokens.weight" if newer_names
                      else "language_model.model.embed_tokens.weight")
    if lm_head:  # The tied head, as some checkpoints store it.
      tensors[lm_head] = tensors[embedding_name].copy()
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    num_head = sum("vision_tower.head." in name for name in tensors)
    self.assertGreater(num_head, 0)
    config = _read_json(hf_dir, "config.json")
    self.assertEqual(config["architectures"],
                     ["Gemma3ForConditionalGeneration"])
    self.assertEqual(config["model_type"], "gemma3")

    ours = self.create_tempdir().full_path
    with self.assertLogs(level="INFO") as logs:
      cfg = hf_convert.hf_to_orbax(hf_dir, ours)
    self.assertTrue(any(f"Skipping {num_head} Hugging Face weights" in line
                        for line in logs.output), logs.output)
    self.assertEqual((cfg.family, cfg.num_layers, cfg.vocab_size,
                      cfg.vision.layers, cfg.vision.tokens_per_image),
                     ("gemma3", 3, 128, 1, 4))
    cfg, params = params_checkpoint.load_converted(ours)
    model = params_checkpoint.model_from_params(cfg, params)
    logits = nnx.jit(lambda m, t: m(t))(model, jnp.asarray(tokens))
    diff = float(np.abs(np.asarray(logits) - want_logits).max())
    print(f"multimodal gemma3 newer_names={newer_names} lm_head={lm_head}: "
          f"max |logit diff| = {diff:.3g}")
    self.assertLessEqual(diff, _TOLERANCE)

    # Export is the whole Gemma3ForConditionalGeneration, without the head.
    back = self.create_tempdir().full_path
    hf_convert.orbax_to_hf(ours, back)
    self.assertEqual(_read_json(back, "config.json")["architectures"],
                     ["Gemma3ForConditionalGeneration"])
    reloaded = transformers.AutoModelForImageTextToText.from_pretrained(
        back, attn_implementation="eager").eval()
    self.assertIsInstance(reloaded,
                          transformers.Gemma3ForConditionalGeneration)
    with torch.no_grad():
      reloaded_logits = reloaded(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(reloaded_logits, want_logits, rtol=0,
                               atol=_TOLERANCE)

  def test_release_config_keeps_only_differences(self):
    # google/gemma-3-4b-it's config.json: `text_config` holds only the keys
    # that differ from Gemma3TextConfig's defaults.
    hf_dir = self.create_tempdir().full_path
    with open(os.path.join(hf_dir, "config.json"), "w", encoding="utf-8") as f:
      json.dump({
          "architectures": ["Gemma3ForConditionalGeneration"],
          "model_type": "gemma3", "mm_tokens_per_image": 256,
          "text_config": {
              "hidden_size": 2560, "intermediate_size": 10240,
              "model_type": "gemma3_text", "num_hidden_layers": 34,
              "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
              "sliding_window": 1024},
          "vision_config": {
              "hidden_size": 1152, "image_size": 896,
              "intermediate_size": 4304, "model_type": "siglip_vision_model",
              "num_attention_heads": 16, "num_hidden_layers": 27,
              "patch_size": 14, "vision_use_head": False}}, f)
    cfg = hf_convert.model_config_from_hf_dir(hf_dir)
    self.assertEqual(
        (cfg.family, cfg.vocab_size, cfg.num_layers, cfg.embed_dim,
         cfg.mlp.dim, cfg.attention.num_heads, cfg.attention.num_kv_heads,
         cfg.attention.head_dim, cfg.pattern.sliding_window,
         cfg.pattern.global_layer_interval, cfg.rope.theta,
         cfg.rope.local_theta, cfg.rope.scaling, cfg.rope.scaling_factor,
         cfg.tie_embeddings),
        ("gemma3", 262_208, 34, 2560, 10240, 8, 4, 256, 1024, 6, 1e6, 1e4,
         "linear", 8.0, True))
    self.assertEqual(
        (cfg.vision.layers, cfg.vision.embed_dim, cfg.vision.mlp_dim,
         cfg.vision.num_heads, cfg.vision.image_size,
         cfg.vision.tokens_per_image, cfg.vision.image_token_id),
        (27, 1152, 4304, 16, 896, 256, 262_144))


class BadInputTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.hf_dir = self.create_tempdir().full_path
    hf_tiny_models.tiny_hf_model("llama3").save_pretrained(self.hf_dir)
    self.out = os.path.join(self.create_tempdir().full_path, "out")

  def _edit_config(self, **changes):
    path = os.path.join(self.hf_dir, "config.json")
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
    config.update(changes)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(config, f)

  def test_missing_config(self):
    os.remove(os.path.join(self.hf_dir, "config.json"))
    with self.assertRaisesRegex(hf_convert.ConversionError,
                                "has no config.json"):
      hf_convert.hf_to_orbax(self.hf_dir, self.out)

  def test_damaged_config_is_named(self):
    path = os.path.join(self.hf_dir, "config.json")
    for content, problem in (("", "is not valid JSON"),
                             ('{"model_type": "lla', "is not valid JSON"),
                             ("[1, 2]", "holds a JSON list, not an object")):
      with open(path, "w", encoding="utf-8") as f:
        f.write(content)
      with self.assertRaisesRegex(hf_convert.ConversionError,
                                  f"{path} {problem}"):
        hf_convert.hf_to_orbax(self.hf_dir, self.out)
      self.assertFalse(os.path.exists(self.out))

  def test_unsupported_architecture_lists_supported(self):
    self._edit_config(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with self.assertRaisesRegex(
        hf_convert.ConversionError,
        r"config.json.*'gpt2'.*GPT2LMHeadModel.*supported model_types: "
        r"\[.*'gemma', .*'qwen3'.*\]"):
      hf_convert.hf_to_orbax(self.hf_dir, self.out)

  def test_missing_weights(self):
    os.remove(os.path.join(self.hf_dir, "model.safetensors"))
    with self.assertRaisesRegex(hf_convert.ConversionError,
                                "No \\*.safetensors weights in"):
      hf_convert.hf_to_orbax(self.hf_dir, self.out)

  def test_shape_mismatch_names_tensor_and_shapes(self):
    self._edit_config(intermediate_size=48)
    with self.assertRaisesRegex(
        hf_convert.ConversionError,
        r"model.layers.0.mlp.gate_proj.weight'?: shape \(96, 64\) does not "
        r"fit .* \(expected Hugging Face shape \(48, 64\)\)"):
      hf_convert.hf_to_orbax(self.hf_dir, self.out)

  def test_missing_tensor_is_named(self):
    path = os.path.join(self.hf_dir, "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    with self.assertRaisesRegex(hf_convert.ConversionError,
                                "model.layers.1.self_attn.k_proj.weight"):
      hf_convert.hf_to_orbax(self.hf_dir, self.out)

  def test_not_a_checkpoint(self):
    with self.assertRaisesRegex(hf_convert.ConversionError,
                                "is not a checkpoint"):
      hf_convert.orbax_to_hf(self.hf_dir, self.out)


if __name__ == "__main__":
  absltest.main()
