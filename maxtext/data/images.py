"""Images for vision-language models: reading and preprocessing with Pillow.

`preprocess(image, settings)` computes what transformers' image processors
with their PIL backend compute for one image (Gemma 3's
`Gemma3ImageProcessorPil` with pan-and-scan off, SigLIP's): convert to RGB
(Pillow's `convert("RGB")`: grayscale replicated, alpha dropped), resize to
the model's square with the configured filter (bilinear), rescale by 1/255
(in float64, then float32) and normalize per channel:
float32 [h, w, 3], channels last as the vision tower takes them
(`maxtext.layers.vision`).

`ImageSettings` holds the settings: those of a model's tower
(`ImageSettings.for_model`), updated from a checkpoint's
`preprocessor_config.json` (`from_hf`), which conversion carries both ways.

`load(source)` opens a file path or encoded bytes and decodes it fully, so
a missing, truncated or non-image file fails here, as an `ImageError`
naming it, not later in a batch.

The input pipeline (`maxtext.data.records`) reads the image parts of chat
records with an `ImageReader`: a part's "path" (absolute, or relative to
`data.image_dir`), or its encoded bytes ("image" or "bytes": bytes, or a
base64 string in JSON), or, for parts without either, the record's image
column (`data.image_field`) in order; preprocessed to [v, h, w, 3]. `ImageInputs` is
what a vision-language model gives the pipeline: its settings and the ids
one image becomes in a prompt.
"""

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import io
import os
from typing import Any

import numpy as np
from PIL import Image

from maxtext.common import json_file
from maxtext.common import sections
from maxtext.layers import vision

# transformers' image preprocessing settings, kept in a checkpoint folder.
PREPROCESSOR_CONFIG = "preprocessor_config.json"

# transformers' `PILImageResampling` values (Pillow's filter numbers).
RESAMPLE_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic",
                    4: "box", 5: "hamming"}


class ImageError(ValueError):
  """An image cannot be read; the message names its source."""


@dataclasses.dataclass(frozen=True)
class ImageSettings:
  """How images are preprocessed (transformers' `preprocessor_config.json`
  keys in brackets).

  Attributes:
    height: Output rows (size.height).
    width: Output columns (size.width).
    resample: Pillow resampling filter number, a key of `RESAMPLE_FILTERS`
      (resample).
    rescale_factor: Multiplies the 0..255 pixel values (rescale_factor).
    mean: Per-channel mean subtracted after rescaling (image_mean).
    std: Per-channel divisor after that (image_std).
    max_tiles: Llama 4: most tiles of one image (max_patches;
      `maxtext.data.image_tiles`).
    resize_to_max_canvas: Llama 4: resize to the largest canvas that fits
      (resize_to_max_canvas).
  """

  height: int = 896
  width: int = 896
  resample: int = 2
  rescale_factor: float = 1 / 255
  mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
  std: tuple[float, float, float] = (0.5, 0.5, 0.5)
  max_tiles: int = 16
  resize_to_max_canvas: bool = False

  def __post_init__(self):
    for name in ("height", "width", "max_tiles"):
      sections.check_int(f"image {name}", getattr(self, name), minimum=1)
    sections.check_choice("image resample", self.resample, RESAMPLE_FILTERS)
    if len(self.mean) != 3 or len(self.std) != 3 or not all(
        s > 0 for s in self.std):
      raise ValueError(f"Image mean={self.mean} and std={self.std} need 3 "
                       "values each, std positive.")

  @classmethod
  def for_model(cls, cfg: vision.VisionConfig) -> "ImageSettings":
    """The defaults at the size `cfg`'s tower takes."""
    return cls(height=cfg.image_size, width=cfg.image_size)

  def from_hf(self, config: Mapping[str, Any]) -> "ImageSettings":
    """These settings updated from a `preprocessor_config.json` dict.

    Raises:
      ValueError: it asks for a step we do not implement (pan and scan,
        no resize, no RGB conversion) or holds invalid values.
    """
    unsupported = {key: config.get(key) for key, ok in (
        ("do_pan_and_scan", (None, False)), ("do_resize", (None, True)),
        ("do_rescale", (None, True)), ("do_normalize", (None, True)),
        ("do_convert_rgb", (None, True))) if config.get(key) not in ok}
    if unsupported:
      raise ValueError(f"preprocessor_config.json asks for {unsupported}; "
                       "supported: pan and scan off, resize, rescale, "
                       "normalize and RGB conversion on.")
    size = config.get("size") or {}
    mean, std = config.get("image_mean", self.mean), config.get(
        "image_std", self.std)
    return dataclasses.replace(
        self, height=size.get("height", self.height),
        width=size.get("width", self.width),
        resample=config.get("resample", self.resample),
        rescale_factor=config.get("rescale_factor", self.rescale_factor),
        mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
        max_tiles=config.get("max_patches", self.max_tiles),
        resize_to_max_canvas=bool(config.get("resize_to_max_canvas",
                                             self.resize_to_max_canvas)))


def model_settings(cfg: vision.VisionConfig, folder: str) -> ImageSettings:
  """The settings of a model with tower `cfg` whose checkpoint is `folder`:
  its `preprocessor_config.json` where it has one, else the defaults.

  Raises:
    ValueError: the file is unreadable or asks for what we do not do.
  """
  settings = ImageSettings.for_model(cfg)
  path = os.path.join(folder, PREPROCESSOR_CONFIG)
  if not os.path.isfile(path):
    return settings
  try:
    return settings.from_hf(json_file.read_object(path))
  except (json_file.JsonFileError, ValueError) as error:
    raise ValueError(f"{path}: {error}") from error


def load(source: str | bytes, name: str | None = None) -> Image.Image:
  """The decoded image at path `source` or of encoded bytes `source`.

  Args:
    source: A file path, or the bytes of an encoded image (PNG, JPEG, ...).
    name: How errors call it (default: the path, or "image bytes").

  Raises:
    ImageError: the file is missing or unreadable, or the data is not a
      complete image.
  """
  if isinstance(source, (bytes, bytearray)):
    name = name or f"image bytes ({len(source)} bytes)"
    stream = io.BytesIO(source)
  else:
    name = name or str(source)
    if not os.path.isfile(source):
      raise ImageError(f"Image {name} does not exist.")
    stream = source
  try:
    with Image.open(stream) as image:
      image.load()  # Decodes it all: a truncated file fails here.
      return image.copy()
  except (OSError, ValueError, Image.DecompressionBombError) as error:
    raise ImageError(f"Image {name} cannot be read: {error}") from error


def preprocess(image: Image.Image, settings: ImageSettings) -> np.ndarray:
  """float32 [height, width, 3] pixel values of `image` (module docstring)."""
  if image.mode != "RGB":
    image = image.convert("RGB")
  resized = image.resize((settings.width, settings.height),
                         resample=settings.resample)
  pixels = (np.asarray(resized).astype(np.float64) *
            settings.rescale_factor).astype(np.float32)
  mean = np.asarray(settings.mean, np.float32)
  std = np.asarray(settings.std, np.float32)
  return (pixels - mean) / std


@dataclasses.dataclass(frozen=True)
class ImageInputs:
  """What the pipeline needs from a vision-language model.

  Attributes:
    settings: Its preprocessing (`model_settings`).
    prompt_ids: (encode, grid) -> the ids an image part becomes (the
      family's `image_prompt_ids` bound to its vision config; `grid`: the
      image's tiles as `pixels` gives them, or None).
    pixels: image -> (what the tower takes of it [n, h, w, 3], its grid of
      tiles or None) (`image_tiles.model_pixels`: one preprocessed image,
      or Llama 4's tiles).
  """

  settings: ImageSettings
  prompt_ids: Callable[[Callable[[str], list[int]], Any], list[int]]
  pixels: Callable[[Image.Image], tuple[np.ndarray, Any]]

  def ids_for(self, tokenizer: Any) -> Callable[[Any], list[int]]:
    """grid -> the ids an image part becomes, with `tokenizer` (special
    tokens allowed); picklable into grain workers."""
    return functools.partial(self.prompt_ids, functools.partial(
        tokenizer.encode, allow_special=True))


@dataclasses.dataclass(frozen=True)
class ImageReader:
  """Reads a record's image parts (picklable into grain workers).

  Attributes:
    settings: Preprocessing.
    image_dir: Where relative paths are ("" : they are refused).
    per_row: Most image slots of one document (`data.images_per_row`;
      Llama 4: tiles).
    pixels: What the tower takes of one image (`ImageInputs.pixels`).
  """

  settings: ImageSettings
  image_dir: str
  per_row: int
  pixels: Callable[[Image.Image], tuple[np.ndarray, Any]]

  def read(self, parts: Sequence[Mapping[str, Any]],
           column: Sequence[Any] | None = None
           ) -> tuple[np.ndarray, list[Any]]:
    """(float32 [slots, h, w, 3] of the parts in order, each part's grid
    of tiles or None).

    Args:
      parts: A conversation's image parts.
      column: The record's image column (`data.image_field`): entries that
        parts without data of their own take in order, each a path, the
        encoded bytes or {"bytes", "path"} (a Hugging Face `Image`
        feature); None: no column.

    Raises:
      ImageError: an image cannot be read (names it).
      ValueError: they take more than `per_row` slots, or the parts and
        the column's entries do not pair up.
    """
    if len(parts) > self.per_row:
      raise ValueError(f"{len(parts)} images, more than data.images_per_row="
                       f"{self.per_row}")
    column = list(column or ())
    bare = [part for part in parts if not _has_data(part)]
    if len(bare) != len(column):
      raise ValueError(
          f"{len(bare)} image parts without data of their own and "
          f"{len(column)} images in the record's image column; they pair up "
          "in order, so the counts must match")
    column_parts = iter(column)
    read = [self.pixels(load(*self._source(
        part if _has_data(part) else _as_part(next(column_parts)))))
            for part in parts]
    if not read:
      return np.zeros((0, self.settings.height, self.settings.width, 3),
                      np.float32), []
    pixels = np.concatenate([image for image, _ in read])
    if len(pixels) > self.per_row:
      raise ValueError(f"{len(parts)} images take {len(pixels)} image "
                       f"slots, more than data.images_per_row={self.per_row}")
    return pixels, [grid for _, grid in read]

  def _source(self, part: Mapping[str, Any]) -> tuple[str | bytes, str]:
    """(path or bytes, how errors name it) of an image part."""
    if isinstance(part.get("path"), str):
      path = part["path"]
      if not os.path.isabs(path):
        if not self.image_dir:
          raise ImageError(f"Image path {path!r} is relative; set "
                           "data.image_dir to the folder it is in.")
        path = os.path.join(self.image_dir, path)
      return path, path
    data = part.get("image", part.get("bytes"))
    if isinstance(data, str):
      try:
        data = base64.b64decode(data, validate=True)
      except binascii.Error as error:
        raise ImageError(f"Image part's string is not base64: {error}") from None
    if not isinstance(data, (bytes, bytearray)):
      raise ImageError(f"Image part {str(dict(part))[:80]!r} has no 'path' "
                       "string and no 'image'/'bytes' data.")
    return bytes(data), f"image bytes ({len(data)} bytes)"


def _has_data(part: Mapping[str, Any]) -> bool:
  """Whether an image part carries its image (a path or bytes)."""
  return any(part.get(key) is not None for key in ("path", "image", "bytes"))


def _as_part(entry: Any) -> dict[str, Any]:
  """An image column's entry as an image part: a path string, encoded
  bytes, or a Hugging Face `Image` feature's {"bytes", "path"} (bytes
  first: a path there is only the original file name)."""
  if isinstance(entry, Mapping):
    if entry.get("bytes") is not None:
      return {"image": entry["bytes"]}
    return {"path": entry.get("path")}
  if isinstance(entry, str):
    return {"path": entry}
  return {"image": entry}
