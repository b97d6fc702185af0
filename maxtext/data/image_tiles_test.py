"""Llama 4's tiling against transformers' own code: its canvas choice
(`find_supported_resolutions`, `get_best_fit`, `get_max_res_without_
distortion`, run from transformers' source with torch; its module imports
torchvision, which we do not have), and its pixels through torch's bilinear
antialiased resize (torchvision's float path), padding, `split_to_tiles`
and the global view: a real photo and synthetic images of several layouts,
within 2 levels of 255 before normalisation; and the prompt ids against
`Llama4Processor`'s."""

import ast
import collections
import math
import os
import re
import types

from absl.testing import absltest
from absl.testing import parameterized
import matplotlib
import numpy as np
from PIL import Image
import torch
import transformers
from transformers import image_transforms
from transformers.models.llama4 import processing_llama4

from maxtext.data import image_tiles
from maxtext.data import images

_PHOTO = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data",
                      "sample_data", "grace_hopper.jpg")


def _transformers_functions():
  """transformers' Llama 4 canvas functions, from its source."""
  path = os.path.join(os.path.dirname(transformers.__file__), "models",
                      "llama4", "image_processing_llama4.py")
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  names = ("get_factors", "get_max_res_without_distortion",
           "find_supported_resolutions", "get_best_fit")
  kept = [node for node in tree.body
          if isinstance(node, ast.FunctionDef) and node.name in names]
  for node in kept:
    node.decorator_list = []
  namespace = dict(math=math, torch=torch,
                   defaultdict=collections.defaultdict, SizeDict=object)
  exec(compile(ast.Module(body=kept, type_ignores=[]), path, "exec"),  # pylint: disable=exec-used
       namespace)
  return namespace


_HF = _transformers_functions()


def _hf_canvases(max_tiles, tile):
  return [tuple(int(v) for v in size) for size in _HF[
      "find_supported_resolutions"](
          max_tiles, types.SimpleNamespace(height=tile, width=tile))]


def _torch_resize(pixels_hwc: np.ndarray, height: int, width: int):
  if pixels_hwc.shape[:2] == (height, width):
    return pixels_hwc
  x = torch.tensor(pixels_hwc).permute(2, 0, 1)[None].float()
  x = torch.nn.functional.interpolate(x, size=(height, width),
                                      mode="bilinear", align_corners=False,
                                      antialias=True)
  return x.round().clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0).numpy()


def _reference_tiles(image: Image.Image, tile: int, max_tiles: int):
  """uint8 [n, t, t, 3] as transformers' processor computes them (before
  its normalisation), and the grid."""
  pixels = np.asarray(image.convert("RGB"))
  height, width = pixels.shape[:2]
  choices = torch.tensor(_hf_canvases(max_tiles, tile))
  canvas = tuple(int(v) for v in _HF["get_best_fit"](
      (height, width), choices, resize_to_max_canvas=False))
  limit = (min(max(height, tile), canvas[0]), min(max(width, tile),
                                                    canvas[1]))
  new_h, new_w = (max(v, 1) for v in _HF["get_max_res_without_distortion"](
      (height, width), limit))
  padded = np.zeros((*canvas, 3), np.uint8)
  padded[:new_h, :new_w] = _torch_resize(pixels, new_h, new_w)
  rows, cols = canvas[0] // tile, canvas[1] // tile
  split = image_transforms.split_to_tiles(
      torch.tensor(padded).permute(2, 0, 1)[None], rows, cols)
  parts = list(split[0].permute(0, 2, 3, 1).numpy())
  if rows * cols > 1:
    parts.append(_torch_resize(pixels, tile, tile))
  return np.stack(parts), (rows, cols)


class CanvasTest(parameterized.TestCase):

  @parameterized.parameters((16, 336), (4, 28), (1, 28))
  def test_canvases_equal_transformers(self, max_tiles, tile):
    self.assertEqual(image_tiles.canvases(max_tiles, tile),
                     _hf_canvases(max_tiles, tile))

  def test_canvas_and_size_equal_transformers(self):
    tile, choices = 336, image_tiles.canvases(16, 336)
    rng = np.random.default_rng(0)
    sizes = [(600, 512), (336, 336), (200, 300), (1000, 200), (337, 337),
             (4000, 3000), (50, 2000), (1, 1), (336, 1344), (400, 6000)]
    sizes += [tuple(int(v) for v in rng.integers(1, 5000, 2))
              for _ in range(300)]
    for height, width in sizes:
      for to_max in (False, True):
        want = tuple(int(v) for v in _HF["get_best_fit"](
            (height, width), torch.tensor(choices),
            resize_to_max_canvas=to_max))
        got = image_tiles.best_canvas(height, width, choices, to_max)
        self.assertEqual(got, want, (height, width, to_max))
        limit = want if to_max else (
            min(max(height, tile), want[0]), min(max(width, tile), want[1]))
        want_size = tuple(max(v, 1) for v in _HF[
            "get_max_res_without_distortion"]((height, width), limit))
        self.assertEqual(
            image_tiles.fitted_size(height, width, want, tile, to_max),
            want_size, (height, width, to_max))


class TilesTest(parameterized.TestCase):

  @parameterized.parameters(
      ("photo", 28, 16), ("photo", 28, 4), ("photo", 336, 16),
      ((40, 90), 28, 4), ((20, 20), 28, 4), ((70, 30), 28, 16),
      ((28, 28), 28, 4))
  def test_pixels_equal_transformers(self, source, tile, max_tiles):
    if source == "photo":
      image = images.load(_PHOTO)
    else:
      image = Image.fromarray(np.random.default_rng(1).integers(
          0, 256, (*source, 3), dtype=np.uint8))
    settings = images.ImageSettings(height=tile, width=tile)
    got, grid = image_tiles.tiles(image, settings, max_tiles=max_tiles)
    want, want_grid = _reference_tiles(image, tile, max_tiles)
    self.assertEqual(grid, want_grid)
    self.assertEqual(got.shape, want.shape)
    levels = (got * 0.5 + 0.5) * 255 - want.astype(np.float32)
    print(f"{source} tile {tile} max {max_tiles}: grid {grid}, max "
          f"|diff| {np.abs(levels).max():.2f} of 255, "
          f"{np.mean(np.abs(levels) > 0.5):.1%} differ")
    self.assertLessEqual(np.abs(levels).max(), 2.0 + 1e-3)

  def test_bad_settings(self):
    image = Image.new("RGB", (10, 10))
    with self.assertRaisesRegex(ValueError, "28x30 is not"):
      image_tiles.tiles(image, images.ImageSettings(height=28, width=30),
                        max_tiles=4)
    with self.assertRaisesRegex(ValueError, "max_tiles=0"):
      image_tiles.tiles(image, images.ImageSettings(height=28, width=28),
                        max_tiles=0)


class PromptTest(parameterized.TestCase):

  @parameterized.parameters((1, 1), (2, 2), (1, 3), (3, 1), (2, 4))
  def test_prompt_ids_equal_transformers(self, rows, cols):
    ids = {"start": 1, "patch": 2, "x_separator": 3, "y_separator": 4,
           "image": 5, "end": 6}
    hf_names = {"<|image_start|>": 1, "<|patch|>": 2,
                "<|tile_x_separator|>": 3, "<|tile_y_separator|>": 4,
                "<|image|>": 5, "<|image_end|>": 6}
    text = processing_llama4.Llama4Processor._prompt_split_image(  # pylint: disable=protected-access
        None, (rows, cols), 4)
    want = [hf_names[token] for token in re.findall(r"<\|[a-z_]+\|>", text)]
    self.assertEqual(image_tiles.prompt_ids(rows, cols, 4, ids), want)


if __name__ == "__main__":
  absltest.main()
