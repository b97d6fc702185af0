"""The input pipeline with images: chat records with image parts become rows
whose image slots hold the images of their placeholders, in order; bad
images are bad records; resumption stays exact."""

import base64
import io
import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import datasets
import numpy as np
from PIL import Image
import pyarrow
from pyarrow import parquet

from maxtext.data import images
from maxtext.data import packing
from maxtext.data import pipeline
from maxtext.data import records
from maxtext.data.data_config import DataConfig

_START, _PLACEHOLDER, _END = 7, 8, 9
_TOKENS_PER_IMAGE = 4
_SETTINGS = images.ImageSettings(height=8, width=8)
_INPUTS = images.ImageInputs(
    _SETTINGS, lambda encode, grid: [_START] +
    [_PLACEHOLDER] * _TOKENS_PER_IMAGE + [_END],
    lambda image: (images.preprocess(image, _SETTINGS)[None], None))


def _config(**overrides) -> DataConfig:
  values = dict(
      source="jsonl", files="", text_field="messages", text_unit="paragraph",
      mixture={}, tokenizer="", add_bos=True, add_eos=True,
      chat_template="gemma", packing="first_fit", images_per_row=2,
      image_dir="", seq_len=96, shuffle_seed=7, num_workers=0, prefetch=0,
      strict=False, max_document_bytes=1 << 16, eval_source="",
      eval_files="", eval_every_steps=0, eval_steps=3)
  values.update(overrides)
  return DataConfig(**values)


def _png(rng, size) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(
      buffer, format="PNG")
  return buffer.getvalue()


class ImagePipelineTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    rng = np.random.default_rng(0)
    self.expected = {}  # Record index -> its images' pixels, in order.
    records = []
    for i in range(24):
      parts, pixels = [], []
      for k in range(i % 3):  # 0, 1 or 2 images.
        data = _png(rng, (5 + i, 9 + k))
        if k == 0:
          name = f"r{i}.png"
          with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)
          parts.append({"type": "image", "path": name})
        else:
          parts.append({"type": "image",
                        "image": base64.b64encode(data).decode()})
        pixels.append(images.preprocess(images.load(data), _SETTINGS))
      self.expected[i] = pixels
      records.append({"messages": [
          {"role": "user", "content": parts + [
              {"type": "text", "text": f"Picture {i}?"}]},
          {"role": "assistant", "content": f"Answer {i}."}]})
    truncated = _png(rng, (6, 6))
    with open(os.path.join(self.dir, "truncated.png"), "wb") as f:
      f.write(truncated[:len(truncated) // 2])
    with open(os.path.join(self.dir, "text.png"), "w", encoding="utf-8") as f:
      f.write("not an image")
    self.bad = {"missing.png": 24, "truncated.png": 25, "text.png": 26}
    for name in self.bad:
      records.append({"messages": [
          {"role": "user", "content": [{"type": "image", "path": name}]},
          {"role": "assistant", "content": "No."}]})
    records.append({"messages": [  # 27: more images than a row holds.
        {"role": "user", "content": [{"type": "image", "path": "r1.png"}] * 3},
        {"role": "assistant", "content": "Three."}]})
    self.files = os.path.join(self.dir, "chat.jsonl")
    with open(self.files, "w", encoding="utf-8") as f:
      for record in records:
        f.write(json.dumps(record) + "\n")

  def _pipeline(self, **overrides):
    config = _config(files=self.files, image_dir=self.dir, **overrides)
    return pipeline.make_train_pipeline(config, batch_size=2,
                                        vocab_size=32000,
                                        image_inputs=_INPUTS)

  @parameterized.parameters("first_fit", "none")
  def test_rows_hold_the_images_of_their_placeholders(self, packing_name):
    data = self._pipeline(packing=packing_name)
    with self.assertLogs(level="WARNING") as logs:
      batches = [next(data) for _ in range(20)]
    data.close()
    for name, line in self.bad.items():
      self.assertTrue(any(f"chat.jsonl:{line + 1}" in entry and name in entry
                          for entry in logs.output), (name, logs.output))
    self.assertTrue(any("3 images, more than data.images_per_row=2" in entry
                        for entry in logs.output), logs.output)
    self.assertIn("images", pipeline.model_keys(_config(files=self.files)))
    seen = 0
    for batch in batches:
      self.assertEqual(batch["images"].shape, (2, 2, 8, 8, 3))
      for row in range(2):
        tokens, rids = batch["inputs"][row], batch["record_ids"][row]
        want = []
        for i in np.unique(rids[rids >= 0]):  # Records in row order.
          _, record = records.split_record_id(int(i))
          self.assertLess(record, 24)  # No bad record got in.
          count = int(np.sum((tokens == _PLACEHOLDER) & (rids == i)))
          # Every image whole: a row never cuts a document with images.
          self.assertEqual(count,
                           _TOKENS_PER_IMAGE * len(self.expected[record]))
          want += self.expected[record]
        slots = batch["images"][row]
        for k, pixels in enumerate(want):
          np.testing.assert_array_equal(slots[k], pixels)
        self.assertFalse(np.any(slots[len(want):]))  # Unused slots: zeros.
        seen += len(want)
        # Placeholders are never trained on.
        self.assertFalse(np.any(batch["mask"][row][
            batch["targets"][row] == _PLACEHOLDER]))
    self.assertGreater(seen, 10)

  def test_strict_stops_at_a_bad_image(self):
    data = self._pipeline(strict=True, shuffle_seed=3)
    with self.assertRaisesRegex(ValueError, r"Bad record at .*chat\.jsonl:"
                                r"\d+: .*(missing|truncated|text|3 images)"):
      for _ in range(40):
        next(data)
    data.close()

  def test_resumes_exactly(self):
    straight = self._pipeline()
    want = [next(straight) for _ in range(8)]
    straight.close()
    first = self._pipeline()
    for _ in range(3):
      next(first)
    state = json.loads(json.dumps(first.checkpoint_state()))
    first.close()
    resumed = self._pipeline()
    resumed.restore_checkpoint_state(state)
    for batch in want[3:]:
      got = next(resumed)
      for key in ("inputs", "images", "mask"):
        np.testing.assert_array_equal(got[key], batch[key], err_msg=key)
    resumed.close()

  @parameterized.parameters("arrow", "parquet")
  def test_an_image_column_fills_bare_image_parts(self, source):
    """A Hugging Face dataset saved to disk (an `Image` column) or Parquet
    (a column of encoded bytes): image parts without data take the row's
    images in order."""
    rng = np.random.default_rng(1)
    rows, expected = [], []
    for i in range(12):
      pictures = [_png(rng, (6 + i, 7 + k)) for k in range(1 + i % 2)]
      expected.append([images.preprocess(images.load(p), _SETTINGS)
                       for p in pictures])
      rows.append({"messages": [
          {"role": "user", "content": [{"type": "image", "path": None,
                                        "image": None, "bytes": None,
                                        "text": None}] * len(pictures) + [
              {"type": "text", "path": None, "image": None, "bytes": None,
               "text": f"What is {i}?"}]},
          {"role": "assistant", "content": [
              {"type": "text", "path": None, "image": None, "bytes": None,
               "text": f"Thing {i}."}]}],
                   "pictures": pictures, "index": i})
    path = os.path.join(self.dir, f"data.{source}")
    if source == "arrow":
      dataset = datasets.Dataset.from_list(rows).cast_column(
          "pictures", datasets.Sequence(datasets.Image()))
      dataset.save_to_disk(path)
    else:
      parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    config = _config(source=source, files=path, image_field="pictures",
                     packing="none")
    data = pipeline.make_train_pipeline(config, batch_size=2,
                                        vocab_size=32000,
                                        image_inputs=_INPUTS)
    for _ in range(6):
      batch = next(data)
      for row in range(2):
        _, record = records.split_record_id(int(batch["record_ids"][row][0]))
        want = expected[record]
        for k, pixels in enumerate(want):
          np.testing.assert_array_equal(batch["images"][row][k], pixels)
        self.assertEqual(int(np.sum(batch["inputs"][row] == _PLACEHOLDER)),
                         _TOKENS_PER_IMAGE * len(want))
    data.close()
    with self.assertRaisesRegex(ValueError, "no column 'photos'"):
      pipeline.make_train_pipeline(
          _config(source=source, files=path, image_field="photos"),
          batch_size=2, vocab_size=32000, image_inputs=_INPUTS)

  def test_mistakes(self):
    with self.assertRaisesRegex(ValueError, "packing='concat'"):
      _config(packing="concat")
    with self.assertRaisesRegex(ValueError, "needs chat records"):
      _config(chat_template="")
    with self.assertRaisesRegex(ValueError, "vision tower"):
      pipeline.make_train_pipeline(_config(files=self.files), batch_size=2,
                                   vocab_size=32000)
    with self.assertRaisesRegex(ValueError, "packing='concat'"):
      packing.pack(None, packing="concat", seq_len=4, num_bins=1,
                   max_document_tokens=4, images_per_row=1)
    with self.assertRaisesRegex(ValueError, "image_field='x' needs image"):
      _config(images_per_row=0, image_field="x")
    reader = images.ImageReader(_SETTINGS, self.dir, 2, _INPUTS.pixels)
    with self.assertRaisesRegex(ValueError, "1 image parts without data .*"
                                "and 2 images in the record's image column"):
      reader.read([{"type": "image"}], [b"a", b"b"])


if __name__ == "__main__":
  absltest.main()
