"""A bundled image-caption set for vision-language SFT: generated pictures of
a colored shape whose captions say what is drawn.

`write(folder, count)` draws `count` pictures (Pillow; deterministic for a
seed) of one shape (`SHAPES`) in one color (`COLORS`) at a random place and
size on a light background, and writes them as PNG files under
`<folder>/images/` with `<folder>/captions.jsonl`: one chat record per
picture, {"messages": [{"role": "user", "content": [{"type": "image",
"path": "images/<i>.png"}, {"type": "text", "text": PROMPT}]},
{"role": "assistant", "content": "a <color> <shape>"}]}; image paths are
relative to `folder` (`data.image_dir`). The caption depends only on the
picture, so a model that learns it must read the image: with other
pictures (shuffled) or blank ones its loss is higher.
"""

import json
import os

import numpy as np
from PIL import Image
from PIL import ImageDraw

COLORS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220),
          "yellow": (235, 210, 20)}
SHAPES = ("square", "circle", "triangle")
PROMPT = "describe the picture"
RECORDS = "captions.jsonl"
IMAGES = "images"


def caption(color: str, shape: str) -> str:
  return f"a {color} {shape}"


def draw(color: str, shape: str, size: int,
         rng: np.random.Generator) -> Image.Image:
  """A `size` x `size` picture of one `shape` in `color`."""
  background = tuple(int(v) for v in rng.integers(225, 256, 3))
  image = Image.new("RGB", (size, size), background)
  extent = int(rng.integers(size // 2, size - 2))
  left, top = (int(v) for v in rng.integers(0, size - extent + 1, 2))
  box = (left, top, left + extent - 1, top + extent - 1)
  pen = ImageDraw.Draw(image)
  if shape == "square":
    pen.rectangle(box, fill=COLORS[color])
  elif shape == "circle":
    pen.ellipse(box, fill=COLORS[color])
  else:
    pen.polygon([(left + extent // 2, top), (box[2], box[3]),
                 (left, box[3])], fill=COLORS[color])
  return image


def write(folder: str, count: int, *, seed: int = 0, size: int = 28,
          start: int = 0, name: str = RECORDS) -> str:
  """Writes `count` pictures and their records file `name` (module
  docstring); returns the records file. `start` numbers the pictures, so a
  second split written to the same folder keeps the first's."""
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.join(folder, IMAGES), exist_ok=True)
  colors = sorted(COLORS)
  path = os.path.join(folder, name)
  with open(path, "w", encoding="utf-8") as f:
    for i in range(start, start + count):
      color = colors[int(rng.integers(len(colors)))]
      shape = SHAPES[int(rng.integers(len(SHAPES)))]
      image = os.path.join(IMAGES, f"{i:05d}.png")
      draw(color, shape, size, rng).save(os.path.join(folder, image))
      record = {"messages": [
          {"role": "user", "content": [{"type": "image", "path": image},
                                       {"type": "text", "text": PROMPT}]},
          {"role": "assistant", "content": caption(color, shape)}]}
      f.write(json.dumps(record) + "\n")
  return path
