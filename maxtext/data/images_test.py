"""Image preprocessing equals transformers' Gemma 3 processor (PIL backend);
unreadable images are clear errors."""

import io
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import matplotlib
import numpy as np
from PIL import Image
from transformers.models.gemma3 import image_processing_pil_gemma3

from maxtext.data import images
from maxtext.layers import vision

_SAMPLES = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data",
                        "sample_data")
_RNG = np.random.default_rng(0)


def _odd(mode: str, height: int, width: int) -> Image.Image:
  channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
  return Image.fromarray(
      _RNG.integers(0, 256, (height, width, *channels), dtype=np.uint8), mode)


class PreprocessTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("photo_jpeg", lambda: images.load(os.path.join(_SAMPLES,
                                                      "grace_hopper.jpg"))),
      ("logo_rgba_png", lambda: images.load(os.path.join(_SAMPLES,
                                                         "logo2.png"))),
      ("grayscale", lambda: _odd("L", 37, 5)),
      ("rgba_tiny", lambda: _odd("RGBA", 3, 2)),
      ("tall", lambda: _odd("RGB", 1000, 13)),
      ("palette", lambda: _odd("RGB", 40, 60).convert("P")),
  )
  def test_equals_transformers(self, make_image):
    image = make_image()
    for size in (896, 28):
      processor = image_processing_pil_gemma3.Gemma3ImageProcessorPil(
          size={"height": size, "width": size}, do_pan_and_scan=False)
      want = processor(image, return_tensors="np")["pixel_values"][0]
      settings = images.ImageSettings().from_hf(processor.to_dict())
      got = images.preprocess(image, settings)
      self.assertEqual(got.dtype, np.float32)
      np.testing.assert_allclose(got, want.transpose(1, 2, 0), atol=1e-5,
                                 rtol=0)

  def test_settings(self):
    tower = vision.VisionConfig(layers=1, embed_dim=8, mlp_dim=8, num_heads=2,
                                patch_size=7, image_size=28,
                                tokens_per_image=4)
    self.assertEqual((images.ImageSettings.for_model(tower).height,
                      images.ImageSettings.for_model(tower).width), (28, 28))
    with self.assertRaisesRegex(ValueError, "do_pan_and_scan"):
      images.ImageSettings().from_hf({"do_pan_and_scan": True})
    with self.assertRaisesRegex(ValueError, "resample=9"):
      images.ImageSettings().from_hf({"resample": 9})
    with self.assertRaisesRegex(ValueError, "height=0"):
      images.ImageSettings(height=0)


class LoadTest(absltest.TestCase):

  def test_bytes_and_path_agree(self):
    path = os.path.join(_SAMPLES, "grace_hopper.jpg")
    with open(path, "rb") as f:
      data = f.read()
    np.testing.assert_array_equal(np.asarray(images.load(data)),
                                  np.asarray(images.load(path)))

  def test_bad_images_name_the_source(self):
    buffer = io.BytesIO()
    _odd("RGB", 64, 64).save(buffer, format="PNG")
    png = buffer.getvalue()
    with tempfile.TemporaryDirectory() as tmp:
      cases = {"missing.png": None, "truncated.png": png[:len(png) // 2],
               "text.png": b"not an image at all", "empty.png": b""}
      for name, data in cases.items():
        path = os.path.join(tmp, name)
        if data is not None:
          with open(path, "wb") as f:
            f.write(data)
        with self.assertRaisesRegex(images.ImageError, name):
          images.load(path)
    with self.assertRaisesRegex(images.ImageError, "image bytes"):
      images.load(png[:100])


if __name__ == "__main__":
  absltest.main()
