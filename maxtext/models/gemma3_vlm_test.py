"""Gemma 3 vision-language model against transformers'
`Gemma3ForConditionalGeneration`: logits on image + text prompts (a real
photo), greedy decode, weights and config both ways, conversion."""

import json
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax.numpy as jnp
import matplotlib
import numpy as np
import torch
import transformers

from configs import gemma3 as gemma3_config
from maxtext.checkpoint import hf_convert
from maxtext.common.model_config import ModelConfig
from maxtext.data import images
from maxtext.inference import generate
from maxtext.models import gemma3
from maxtext.models import hf_weights
from maxtext.models import registry
from testing import hf_reference
from testing import hf_tiny_models

_BOI, _EOI, _IMAGE = (hf_tiny_models.GEMMA3_VLM_IDS[key] for key in (
    "boi_token_index", "eoi_token_index", "image_token_index"))
_TOKENS_PER_IMAGE = 4
_TOLERANCE = 1e-4
_PHOTO = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data",
                      "sample_data", "grace_hopper.jpg")


def _prompt(rng, text_lengths) -> list[int]:
  """Text, then an image's placeholders between its start and end ids, per
  image; then text."""
  ids = []
  for length in text_lengths[:-1]:
    ids += list(rng.integers(0, 90, length))
    ids += [_BOI] + [_IMAGE] * _TOKENS_PER_IMAGE + [_EOI]
  return ids + list(rng.integers(0, 90, text_lengths[-1]))


def _pixels(rng, settings) -> np.ndarray:
  """Two images per row [2, 2, h, w, 3]: the photo and noise, then noise
  and the photo dimmed."""
  photo = images.preprocess(images.load(_PHOTO), settings)
  noise = rng.uniform(-1, 1, (2, *photo.shape)).astype(np.float32)
  return np.stack([np.stack([photo, noise[0]]),
                   np.stack([noise[1], photo * 0.5])])


def _hf_inputs(tokens_BL, pixels_Bvhwe):
  batch, count = pixels_Bvhwe.shape[:2]
  pixel_values = np.ascontiguousarray(pixels_Bvhwe.reshape(
      batch * count, *pixels_Bvhwe.shape[2:]).transpose(0, 3, 1, 2))
  return dict(input_ids=torch.tensor(tokens_BL),
              pixel_values=torch.tensor(pixel_values, dtype=torch.float32),
              token_type_ids=torch.tensor(tokens_BL == _IMAGE,
                                          dtype=torch.long))


class Gemma3VisionLanguageTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model = hf_tiny_models.tiny_gemma3_vlm()
    cls.cfg = gemma3.model_config_from_hf(cls.hf_model.config.to_dict())
    cls.weights = hf_reference.state_dict(cls.hf_model)
    rng = np.random.default_rng(0)
    cls.settings = images.ImageSettings.for_model(cls.cfg.vision)
    cls.tokens_BL = np.array([_prompt(rng, (3, 5, 4)),
                              _prompt(rng, (1, 2, 9))], np.int32)
    cls.pixels_Bvhwe = _pixels(rng, cls.settings).astype(np.float32)
    with torch.no_grad():
      cls.want = cls.hf_model(**_hf_inputs(cls.tokens_BL,
                                           cls.pixels_Bvhwe)).logits.numpy()

  def _model(self, **changes):
    return hf_weights.model_from_hf_weights(self.cfg.replace(**changes),
                                            self.weights)

  def test_config(self):
    vision = self.cfg.vision
    self.assertEqual((vision.layers, vision.embed_dim, vision.tokens_per_image,
                      vision.image_token_id, vision.image_start_id,
                      vision.image_end_id), (2, 32, 4, _IMAGE, _BOI, _EOI))
    again = transformers.Gemma3Config(
        **gemma3.hf_config_from_model_config(self.cfg))
    self.assertEqual(gemma3.model_config_from_hf(again.to_dict()), self.cfg)

  @parameterized.parameters(True, False)
  def test_logits_match(self, scan_layers):
    model = self._model(scan_layers=scan_layers)
    logits = hf_reference.image_text_logits(model, self.tokens_BL,
                                            self.pixels_Bvhwe)
    diff = float(np.abs(logits - self.want).max())
    print(f"gemma3 vlm scan_layers={scan_layers}: max |logit diff| = {diff}")
    self.assertLessEqual(diff, _TOLERANCE)
    # The images' bidirectional blocks matter here: causal attention alone
    # (transformers without token_type_ids) gives other logits.
    inputs = _hf_inputs(self.tokens_BL, self.pixels_Bvhwe)
    del inputs["token_type_ids"]
    with torch.no_grad():
      causal = self.hf_model(**inputs).logits.numpy()
    self.assertGreater(float(np.abs(causal - self.want).max()), 1e-2)

  def test_images_change_the_logits(self):
    model = self._model()
    shuffled = hf_reference.image_text_logits(model, self.tokens_BL,
                                              self.pixels_Bvhwe[:, ::-1])
    self.assertGreater(float(np.abs(shuffled - self.want).max()), 1e-2)

  def test_cached_prefill_and_greedy_decode(self):
    model = self._model()
    row = self.tokens_BL[1]
    prefill = generate.prefill_logits(model, row.tolist(),
                                      self.pixels_Bvhwe[1])
    np.testing.assert_allclose(prefill, self.want[1], atol=_TOLERANCE)
    inputs = _hf_inputs(self.tokens_BL, self.pixels_Bvhwe)
    with torch.no_grad():
      # All ones: generate would otherwise mask the tokens equal to the
      # padding id (0).
      want = self.hf_model.generate(
          **inputs, attention_mask=torch.ones_like(inputs["input_ids"]),
          max_new_tokens=6, do_sample=False)[:, row.size:].numpy()
    for kv_cache in ("dense", "paged"):
      got = generate.generate(model, self.tokens_BL.tolist(),
                              max_new_tokens=6, kv_cache=kv_cache,
                              page_size=8, images=self.pixels_Bvhwe)
      np.testing.assert_array_equal(np.array(got), want, err_msg=kv_cache)

  def test_weights_round_trip(self):
    want = dict(self.weights)
    del want["language_model.lm_head.weight"]  # Tied: not stored.
    for scan_layers in (True, False):
      got = hf_weights.to_hf_weights(self._model(scan_layers=scan_layers))
      self.assertEqual(sorted(got), sorted(want))
      for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)

  def test_conversion_both_ways(self):
    with tempfile.TemporaryDirectory() as tmp:
      hf_dir = os.path.join(tmp, "hf")
      self.hf_model.save_pretrained(hf_dir)
      preprocessor = {"image_processor_type": "Gemma3ImageProcessor",
                      "size": {"height": 28, "width": 28}, "resample": 2,
                      "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                      "rescale_factor": 1 / 255, "do_pan_and_scan": False}
      with open(os.path.join(hf_dir, "preprocessor_config.json"), "w",
                encoding="utf-8") as f:
        json.dump(preprocessor, f)
      converted = os.path.join(tmp, "converted")
      cfg = hf_convert.hf_to_orbax(hf_dir, converted)
      self.assertEqual(cfg.vision, self.cfg.vision)
      exported = os.path.join(tmp, "exported")
      hf_convert.orbax_to_hf(converted, exported)
      with open(os.path.join(exported, "preprocessor_config.json"),
                encoding="utf-8") as f:
        settings = self.settings.from_hf(json.load(f))
      self.assertEqual(settings, self.settings)
      reloaded = transformers.AutoModelForImageTextToText.from_pretrained(
          exported, dtype=torch.float32).eval()
      with torch.no_grad():
        logits = reloaded(**_hf_inputs(self.tokens_BL,
                                       self.pixels_Bvhwe)).logits.numpy()
    np.testing.assert_allclose(logits, self.want, atol=_TOLERANCE)

  def test_bad_settings_name_the_key(self):
    for changes, key in (
        (dict(mm_tokens_per_image=3), "mm_tokens_per_image"),
        (dict(vision_heads=5), "vision_heads"),
        (dict(vision_image_size=30), "vision_image_size")):
      with self.assertRaisesRegex(ValueError, key):
        self.cfg.replace(**changes)
    text_only = registry.create_model(self.cfg.replace(vision_layers=0),
                                      rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, "vision_layers=0"):
      text_only(jnp.asarray(self.tokens_BL),
                images_Bvhwe=jnp.asarray(self.pixels_Bvhwe))


class Gemma3VisionSizesTest(parameterized.TestCase):

  @parameterized.parameters(("4b_vlm", 4.30), ("12b_vlm", 12.19),
                            ("27b_vlm", 27.43))
  def test_parameter_count_equals_transformers(self, variant, billions):
    """google/gemma-3-{4b,12b,27b}-it: as many parameters as transformers'
    `Gemma3ForConditionalGeneration` of the same config (built without
    memory), the published 4.3B, 12.2B and 27.4B."""
    cfg = ModelConfig.from_dict(gemma3_config.get_config(variant).model)
    count, hf_count = hf_reference.parameter_counts(
        cfg, transformers.Gemma3ForConditionalGeneration,
        transformers.Gemma3Config(**gemma3.hf_config_from_model_config(cfg)))
    self.assertEqual(count, hf_count)
    self.assertEqual(round(count / 1e9, 2), billions)


if __name__ == "__main__":
  absltest.main()
