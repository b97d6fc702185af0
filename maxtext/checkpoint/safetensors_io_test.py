"""Lazy safetensors reading, sharded writing, refusal of pickle files."""

import json
import os
import pickle

from absl.testing import absltest
import ml_dtypes
import numpy as np
import torch
from safetensors import torch as safetensors_torch

from maxtext.checkpoint import safetensors_io


class _MarksWhenUnpickled:
  """Unpickling this creates a marker file: proof that it was loaded."""

  def __init__(self, marker: str):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


class SafetensorsIoTest(absltest.TestCase):

  def test_write_then_read_sharded_with_bfloat16(self):
    rng = np.random.RandomState(0)
    tensors = {
        "a.weight": rng.randn(40, 30).astype(np.float32),
        "b.weight": rng.randn(50).astype(ml_dtypes.bfloat16),
        "c.weight": rng.randn(20, 10).astype(np.float16),
    }
    out = self.create_tempdir().full_path
    files = safetensors_io.write_weights(out, lambda: iter(tensors.items()),
                                         max_shard_size=4000)
    self.assertLen(files, 2)  # a (4800 bytes) alone; b and c together.
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
      index = json.load(f)
    self.assertEqual(index["weight_map"]["a.weight"],
                     "model-00001-of-00002.safetensors")
    # The reference reader (torch) agrees, bfloat16 included.
    reference = {}
    for path in files:
      reference.update(safetensors_torch.load_file(path))
    self.assertEqual(reference["b.weight"].dtype, torch.bfloat16)
    np.testing.assert_array_equal(reference["b.weight"].float().numpy(),
                                  tensors["b.weight"].astype(np.float32))
    weights = safetensors_io.open_weights(out)
    self.assertEqual(sorted(weights), sorted(tensors))
    for name, array in tensors.items():
      self.assertEqual(weights[name].dtype, array.dtype)
      np.testing.assert_array_equal(weights[name], array)

  def test_reads_torch_written_bfloat16(self):
    out = self.create_tempdir().full_path
    tensor = torch.randn(3, 5).to(torch.bfloat16)
    safetensors_torch.save_file({"x": tensor},
                                os.path.join(out, "model.safetensors"))
    got = safetensors_io.open_weights(out)["x"]
    self.assertEqual(got.dtype, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.astype(np.float32),
                                  tensor.float().numpy())

  def test_pickle_checkpoint_is_refused_unopened(self):
    folder = self.create_tempdir().full_path
    marker = os.path.join(folder, "unpickled")
    for name in ("pytorch_model.bin", "model.pt"):
      with open(os.path.join(folder, name), "wb") as f:
        pickle.dump(_MarksWhenUnpickled(marker), f)
    with self.assertRaisesRegex(
        safetensors_io.WeightsError,
        r"pickle-format weights \['model.pt', 'pytorch_model.bin'\].*"
        r"Convert them to safetensors"):
      safetensors_io.open_weights(folder)
    self.assertFalse(os.path.exists(marker))

  def test_index_naming_a_missing_file(self):
    folder = self.create_tempdir()
    folder.create_file("model.safetensors.index.json", content=json.dumps(
        {"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    with self.assertRaisesRegex(safetensors_io.WeightsError,
                                "lists model-00001-of-00002.safetensors"):
      safetensors_io.open_weights(folder.full_path)

  def test_damaged_or_hostile_index_is_named(self):
    folder = self.create_tempdir().full_path
    index = os.path.join(folder, safetensors_io.INDEX_FILENAME)
    for content, problem in (
        ("", "is not valid JSON"), ('{"weight_map": {"a": "m', "not valid"),
        ("[1]", "holds a JSON list"), ('{"weight_map": 3}', "no 'weight_map'"),
        ('{"weight_map": {"a": "../x.safetensors"}}',
         "'../x.safetensors', which are not file names"),
        ('{"weight_map": {"a": "/etc/passwd"}}', "'/etc/passwd'"),
        ('{"weight_map": {"a": 7}}', "maps weights to 7"),
        ('{"weight_map": {"a": ["x"]}}', r"maps weights to \['x'\]"),
        ('{"weight_map": {"a": 1' + "0" * 5000 + "}}", "is not valid JSON")):
      with open(index, "w", encoding="utf-8") as f:
        f.write(content)
      with self.assertRaisesRegex(safetensors_io.WeightsError, problem):
        safetensors_io.weight_files(folder)

  def test_hostile_files_are_named_before_any_tensor_is_read(self):
    def file_of(header, data=b"\0" * 24):
      text = header if isinstance(header, bytes) else json.dumps(
          header).encode()
      return len(text).to_bytes(8, "little") + text + data

    good = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
    huge = safetensors_io.MAX_HEADER_BYTES + 1
    cases = (
        (b"\x01\x02", "shorter than the 8-byte header length"),
        (huge.to_bytes(8, "little") + b"{}",
         f"declares a {huge}-byte header, more than the file's 2 bytes"),
        (file_of(b"{not json"), "malformed header"),
        (file_of(b"[" * 100_000 + b"]" * 100_000), "malformed header"),
        (file_of([1, 2]), "not a JSON object"),
        (file_of({"w": "F32"}), "'w'.*header entry is not a JSON object"),
        (file_of({"w": {**good["w"], "dtype": "F128"}}),
         "'w'.*dtype 'F128' is not supported"),
        (file_of({"w": {**good["w"], "shape": [2, -3]}}),
         r"'w'.*shape \[2, -3\] is not a list of sizes"),
        (file_of({"w": {**good["w"], "data_offsets": [0, 10**12]}}),
         r"'w'.*data_offsets \[0, 1000000000000\] do not lie inside the"
         " file's 24 bytes"),
        (file_of(good, data=b"\0" * 20), "do not lie inside the file's 20"),
        (file_of({"w": {**good["w"], "shape": [2, 2]}}),
         r"hold 24 bytes, but F32 \[2, 2\] needs 16"),
    )
    for content, message in cases:
      folder = self.create_tempdir()
      with open(os.path.join(folder.full_path, "model.safetensors"),
                "wb") as f:
        f.write(content)
      with self.subTest(message), self.assertRaisesRegex(
          safetensors_io.WeightsError, message):
        safetensors_io.open_weights(folder.full_path)
    folder = self.create_tempdir()
    with open(os.path.join(folder.full_path, "model.safetensors"), "wb") as f:
      f.write(file_of(good, data=np.arange(6, dtype=np.float32).tobytes()))
    np.testing.assert_array_equal(
        safetensors_io.open_weights(folder.full_path)["w"],
        np.arange(6, dtype=np.float32).reshape(2, 3))

  def test_parse_size(self):
    self.assertEqual(safetensors_io.parse_size("5GB"), 5 * 10**9)
    self.assertEqual(safetensors_io.parse_size("2MiB"), 2 * 2**20)
    self.assertEqual(safetensors_io.parse_size("123"), 123)


if __name__ == "__main__":
  absltest.main()
