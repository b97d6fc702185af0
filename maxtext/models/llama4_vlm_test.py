"""Llama 4 vision-language model against transformers'
`Llama4ForConditionalGeneration`: logits on image + text prompts (a real
photo and synthetic images tiled by `maxtext.data.image_tiles` into 2 x 2,
1 x 3 and 1 x 1 layouts, the global views included; two rows with
different numbers of tiles), greedy decode, weights and config both ways,
conversion."""

import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import matplotlib
import numpy as np
from PIL import Image
import torch
import transformers

from configs import llama4 as llama4_config
from maxtext.checkpoint import hf_convert
from maxtext.common.model_config import ModelConfig
from maxtext.data import image_tiles
from maxtext.data import images
from maxtext.inference import generate
from maxtext.models import hf_weights
from maxtext.models import llama4
from testing import hf_reference
from testing import hf_tiny_models

_TOLERANCE = 1e-4
_PHOTO = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data",
                      "sample_data", "grace_hopper.jpg")
_IDS = {name: hf_tiny_models.LLAMA4_VLM_TEXT_IDS[token] for name, token in (
    ("start", "<|image_start|>"), ("patch", "<|patch|>"),
    ("x_separator", "<|tile_x_separator|>"),
    ("y_separator", "<|tile_y_separator|>"), ("image", "<|image|>"),
    ("end", "<|image_end|>"))}


def _rows(rng, settings):
  """Token rows and their tiles: row 0 the photo (2 x 2 tiles and the
  global view) then a small image (1 tile), row 1 a wide image (1 x 3 and
  the global view); text around them."""
  def synthetic(height, width):
    return Image.fromarray(rng.integers(0, 256, (height, width, 3),
                                        dtype=np.uint8))

  rows = []
  for row_images in ((images.load(_PHOTO), synthetic(20, 20)),
                     (synthetic(40, 90),)):
    tokens, tiles = [], []
    for image in row_images:
      pixels, (rows_, cols) = image_tiles.tiles(image, settings, max_tiles=4)
      tokens += list(rng.integers(0, 100, 3)) + image_tiles.prompt_ids(
          rows_, cols, 4, _IDS)
      tiles.append(pixels)
    rows.append((tokens + list(rng.integers(0, 100, 2)),
                 np.concatenate(tiles)))
  return rows


class Llama4VisionLanguageTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf_model = hf_tiny_models.tiny_llama4_vlm()
    cls.cfg = llama4.model_config_from_hf(cls.hf_model.config.to_dict())
    cls.weights = hf_reference.state_dict(cls.hf_model)
    rows = _rows(np.random.default_rng(0),
                 images.ImageSettings(height=28, width=28))
    length = max(len(tokens) for tokens, _ in rows)
    count = max(len(tiles) for _, tiles in rows)
    # Rows of equal length (the shorter padded at its end with text) and
    # of equal tile counts (the fewer padded with blank tiles, unused).
    cls.tokens_BL = np.array([tokens + [7] * (length - len(tokens))
                              for tokens, _ in rows], np.int32)
    cls.pixels_Bvhwe = np.zeros((len(rows), count, 28, 28, 3), np.float32)
    for b, (_, tiles) in enumerate(rows):
      cls.pixels_Bvhwe[b, :len(tiles)] = tiles
    cls.hf_pixels = np.concatenate([tiles for _, tiles in rows]).transpose(
        0, 3, 1, 2)
    with torch.no_grad():
      cls.want = cls.hf_model(**cls._hf_inputs()).logits.numpy()

  @classmethod
  def _hf_inputs(cls):
    return dict(input_ids=torch.tensor(cls.tokens_BL),
                pixel_values=torch.tensor(cls.hf_pixels))

  def _model(self, **changes):
    return hf_weights.model_from_hf_weights(self.cfg.replace(**changes),
                                            self.weights)

  def test_config(self):
    vision = self.cfg.vision
    self.assertEqual(
        (vision.arch, vision.layers, vision.embed_dim, vision.tokens_per_image,
         vision.adapter_dim, vision.image_token_id),
        ("llama4", 2, 32, 4, 48, 120))
    again = transformers.Llama4Config(
        **llama4.hf_config_from_model_config(self.cfg))
    self.assertEqual(llama4.model_config_from_hf(again.to_dict()), self.cfg)

  @parameterized.parameters(True, False)
  def test_logits_match(self, scan_layers):
    model = self._model(scan_layers=scan_layers)
    logits = hf_reference.image_text_logits(model, self.tokens_BL,
                                            self.pixels_Bvhwe)
    diff = float(np.abs(logits - self.want).max())
    print(f"llama4 vlm scan_layers={scan_layers} tiles "
          f"{self.pixels_Bvhwe.shape}: max |logit diff| = {diff}")
    self.assertLessEqual(diff, _TOLERANCE)

  def test_images_change_the_logits(self):
    model = self._model()
    shuffled = hf_reference.image_text_logits(model, self.tokens_BL,
                                              self.pixels_Bvhwe[:, ::-1])
    self.assertGreater(float(np.abs(shuffled - self.want).max()), 1e-2)

  def test_greedy_decode(self):
    model = self._model()
    with torch.no_grad():
      inputs = self._hf_inputs()
      want = self.hf_model.generate(
          **inputs, attention_mask=torch.ones_like(inputs["input_ids"]),
          max_new_tokens=6, do_sample=False)[:, self.tokens_BL.shape[1]:]
    for kv_cache in ("dense", "paged"):
      got = generate.generate(model, self.tokens_BL.tolist(),
                              max_new_tokens=6, kv_cache=kv_cache,
                              page_size=8, images=self.pixels_Bvhwe)
      np.testing.assert_array_equal(np.array(got), want.numpy(),
                                    err_msg=kv_cache)

  def test_weights_round_trip(self):
    for scan_layers in (True, False):
      got = hf_weights.to_hf_weights(self._model(scan_layers=scan_layers))
      self.assertEqual(sorted(got), sorted(self.weights))
      for name, array in self.weights.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)

  def test_conversion_both_ways(self):
    with tempfile.TemporaryDirectory() as tmp:
      hf_dir = os.path.join(tmp, "hf")
      self.hf_model.save_pretrained(hf_dir)
      converted = os.path.join(tmp, "converted")
      cfg = hf_convert.hf_to_orbax(hf_dir, converted)
      self.assertEqual(cfg.vision, self.cfg.vision)
      exported = os.path.join(tmp, "exported")
      hf_convert.orbax_to_hf(converted, exported)
      reloaded = transformers.AutoModelForImageTextToText.from_pretrained(
          exported, dtype=torch.float32).eval()
      with torch.no_grad():
        logits = reloaded(**self._hf_inputs()).logits.numpy()
    np.testing.assert_allclose(logits, self.want, atol=_TOLERANCE)

  def test_image_prompt_ids(self):
    """An image of 1 x 2 tiles: its start, two tiles' placeholders with a
    column and a row separator, <|image|>, the global view's, its end; the
    separators' ids from the tokenizer, which must have them."""
    specials = dict(hf_tiny_models.LLAMA4_VLM_TEXT_IDS)
    ids = llama4.image_prompt_ids(self.cfg.vision,
                                  lambda text: [specials[text]], (1, 2))
    self.assertEqual(ids, [121] + [120] * 4 + [123] + [120] * 4 + [124, 125]
                     + [120] * 4 + [122])
    with self.assertRaisesRegex(
        ValueError, r"'<\|tile_x_separator\|>' as \[1, 2\], not as one"):
      llama4.image_prompt_ids(self.cfg.vision, lambda text: [1, 2], (1, 2))

  def test_bad_settings_name_the_key(self):
    for changes, key in (
        (dict(vision_mlp_dim=96), "vision_mlp_dim=96.*window"),
        (dict(vision_heads=16), "vision_heads=16.*divides by 4"),
        (dict(vision_adapter_dim=0), "vision_adapter_dim=0"),
        (dict(vision_arch="clip"), "vision_arch='clip'")):
      with self.assertRaisesRegex(ValueError, key):
        self.cfg.replace(**changes)
    bad = self.hf_model.config.to_dict()
    bad["vision_config"]["projector_output_dim"] = 40
    with self.assertRaisesRegex(ValueError, "widths must be equal"):
      llama4.model_config_from_hf(bad)


class Llama4VisionSizesTest(parameterized.TestCase):

  @parameterized.parameters(("scout_vlm", 108.64), ("maverick_vlm", 401.58))
  def test_parameter_count_equals_transformers(self, variant, billions):
    """meta-llama/Llama-4-{Scout-17B-16E,Maverick-17B-128E}: as many
    parameters as transformers' `Llama4ForConditionalGeneration` of the
    same config (built without memory)."""
    cfg = ModelConfig.from_dict(llama4_config.get_config(variant).model)
    count, hf_count = hf_reference.parameter_counts(
        cfg, transformers.Llama4ForConditionalGeneration,
        transformers.Llama4Config(**llama4.hf_config_from_model_config(cfg)))
    self.assertEqual(count, hf_count)
    self.assertEqual(round(count / 1e9, 2), billions)


if __name__ == "__main__":
  absltest.main()
