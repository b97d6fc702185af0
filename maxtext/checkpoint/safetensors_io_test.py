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

  def test_parse_size(self):
    self.assertEqual(safetensors_io.parse_size("5GB"), 5 * 10**9)
    self.assertEqual(safetensors_io.parse_size("2MiB"), 2 * 2**20)
    self.assertEqual(safetensors_io.parse_size("123"), 123)


if __name__ == "__main__":
  absltest.main()
