"""Llama 4's image tiles, with Pillow and numpy.

transformers' `Llama4ImageProcessor` runs on torchvision only; this module
computes the same with Pillow (which we already depend on):

1. The canvas: of the grids of at most `max_tiles` tiles of `tile` pixels
   (`canvases`, in transformers' order), the one `best_canvas` picks: the
   smallest upscale that fits the image if one does (with
   `resize_to_max_canvas`, the largest), else the mildest downscale; ties
   go to the smallest area, then the first in order. Scales are compared in
   float32, as transformers compares them.
2. The image is resized without distortion to fit the canvas, never past
   its own size or one tile where it is smaller (`fitted_size`), with
   Pillow's bilinear filter (antialiased when shrinking, as torchvision's
   `antialias=True`), padded right and bottom with black to the canvas, and
   cut into its rows x cols tiles, row by row.
3. With more than one tile, the whole image resized to one tile (its aspect
   distorted) follows as the global view.
4. Pixels are rescaled and normalised as `images.preprocess` does, in
   float32. transformers rounds those values to bfloat16 and resizes with
   torch's kernels: pixel values differ from its by at most a few levels of
   255 where the filters round differently (`image_tiles_test`).

`prompt_ids` is the prompt an image of rows x cols tiles becomes
(transformers' `Llama4Processor`): its tiles' soft-token placeholders with
tile separators, then the global view's.

Shapes: n tiles, t the tile side, 3 channels last.
"""

from collections.abc import Mapping

import numpy as np
from PIL import Image

from maxtext.data import images
from maxtext.layers import vision as vision_lib


def canvases(max_tiles: int, tile: int) -> list[tuple[int, int]]:
  """Every (height, width) grid of at most `max_tiles` tiles, in pixels, in
  transformers' order (tile counts from `max_tiles` down, grouped by
  aspect ratio in order of first appearance)."""
  by_ratio: dict[float, list[tuple[int, int]]] = {}
  for count in range(max_tiles, 0, -1):
    for rows in range(1, count + 1):
      if count % rows == 0:
        by_ratio.setdefault(rows / (count // rows), []).append(
            (rows * tile, count // rows * tile))
  return [canvas for group in by_ratio.values() for canvas in group]


def best_canvas(height: int, width: int, choices: list[tuple[int, int]],
                resize_to_max_canvas: bool = False) -> tuple[int, int]:
  """The canvas of `choices` an image of height x width goes on (module
  docstring, step 1)."""
  sizes = np.asarray(choices, np.int64)
  scales = np.minimum(sizes[:, 0].astype(np.float32) / np.float32(height),
                      sizes[:, 1].astype(np.float32) / np.float32(width))
  upscales = scales[scales >= 1]
  if upscales.size:
    chosen = upscales.max() if resize_to_max_canvas else upscales.min()
  else:
    chosen = scales[scales < 1].max()
  candidates = sizes[scales == chosen]
  best = candidates[np.argmin(candidates[:, 0] * candidates[:, 1])]
  return int(best[0]), int(best[1])


def fitted_size(height: int, width: int, canvas: tuple[int, int], tile: int,
                resize_to_max_canvas: bool = False) -> tuple[int, int]:
  """The size an image of height x width is resized to on `canvas` (module
  docstring, step 2)."""
  if resize_to_max_canvas:
    limit_h, limit_w = canvas
  else:
    limit_h = min(max(height, tile), canvas[0])
    limit_w = min(max(width, tile), canvas[1])
  scale_w, scale_h = limit_w / width, limit_h / height
  if scale_w < scale_h:
    new_h, new_w = min(int(np.floor(height * scale_w)), limit_h), limit_w
  else:
    new_h, new_w = limit_h, min(int(np.floor(width * scale_h)), limit_w)
  return max(new_h, 1), max(new_w, 1)


def tiles(image: Image.Image, settings: images.ImageSettings, *,
          max_tiles: int, resize_to_max_canvas: bool = False
          ) -> tuple[np.ndarray, tuple[int, int]]:
  """(float32 [n, t, t, 3] tiles of `image`, then its global view when
  n > 1; its grid (rows, cols)), t = `settings.height` (module docstring).

  Raises:
    ValueError: the settings' tile is not square, or max_tiles < 1.
  """
  tile = settings.height
  if settings.width != tile:
    raise ValueError(f"Llama 4 tiles are square: image size {tile}x"
                     f"{settings.width} is not.")
  if max_tiles < 1:
    raise ValueError(f"max_tiles={max_tiles} must be >= 1.")
  if image.mode != "RGB":
    image = image.convert("RGB")
  canvas = best_canvas(image.height, image.width, canvases(max_tiles, tile),
                       resize_to_max_canvas)
  new_h, new_w = fitted_size(image.height, image.width, canvas, tile,
                             resize_to_max_canvas)
  padded = np.zeros((*canvas, 3), np.uint8)
  padded[:new_h, :new_w] = _resized(image, new_h, new_w, settings)
  rows, cols = canvas[0] // tile, canvas[1] // tile
  grid = padded.reshape(rows, tile, cols, tile, 3).transpose(0, 2, 1, 3, 4)
  parts = list(grid.reshape(rows * cols, tile, tile, 3))
  if rows * cols > 1:
    parts.append(_resized(image, tile, tile, settings))
  return _normalized(np.stack(parts), settings), (rows, cols)


def _resized(image: Image.Image, height: int, width: int,
             settings: images.ImageSettings) -> np.ndarray:
  if (image.height, image.width) == (height, width):
    return np.asarray(image)
  return np.asarray(image.resize((width, height),
                                 resample=settings.resample))


def _normalized(pixels: np.ndarray,
                settings: images.ImageSettings) -> np.ndarray:
  scaled = (pixels.astype(np.float64) *
            settings.rescale_factor).astype(np.float32)
  return ((scaled - np.asarray(settings.mean, np.float32)) /
          np.asarray(settings.std, np.float32))


def model_pixels(vision: vision_lib.VisionConfig,
                 settings: images.ImageSettings, image: Image.Image
                 ) -> tuple[np.ndarray, tuple[int, int] | None]:
  """What a tower takes of one image: with Llama 4's tower its tiles and
  grid (`tiles`, `settings.max_tiles`), else the one preprocessed image
  [1, h, w, 3] and None."""
  if vision.arch == "llama4":
    return tiles(image, settings, max_tiles=settings.max_tiles,
                 resize_to_max_canvas=settings.resize_to_max_canvas)
  return images.preprocess(image, settings)[None], None


def prompt_ids(rows: int, cols: int, tokens_per_tile: int,
               ids: Mapping[str, int]) -> list[int]:
  """The ids an image of rows x cols tiles becomes in a prompt: its start,
  each tile's `tokens_per_tile` "patch" placeholders (an "x_separator"
  between tiles of a row, a "y_separator" after each row) when it has more
  than one tile, then "image", the global view's (or only tile's)
  placeholders and its end (`ids`: "start", "patch", "x_separator",
  "y_separator", "image", "end")."""
  patches = [ids["patch"]] * tokens_per_tile
  out = [ids["start"]]
  if rows * cols > 1:
    for _ in range(rows):
      for col in range(cols):
        out += patches + ([ids["x_separator"]] if col < cols - 1 else [])
      out.append(ids["y_separator"])
  return out + [ids["image"]] + patches + [ids["end"]]
