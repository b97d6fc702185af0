"""Tests of dequantizing FP8 block-scaled and MXFP4 weights as they are read.

Checkpoints are written in the published layouts by the reference quantizers
of `testing.quantized_checkpoints`; the dequantized arrays are compared with a per-block numpy reference
(FP8, including partial edge blocks that transformers' CPU dequantizer
cannot take) and with transformers' own MXFP4 unpacking.
"""

import re

from absl.testing import absltest
import ml_dtypes
import numpy as np
import torch
from transformers.integrations import mxfp4 as hf_mxfp4

from maxtext.checkpoint import quantized_weights
from maxtext.checkpoint import safetensors_io
from testing import quantized_checkpoints

_BLOCK = (128, 128)


def fp8_reference(quantized, scale, block) -> np.ndarray:
  """Block by block: each block's values times its scale, in float32."""
  out = np.zeros(quantized.shape, np.float32)
  rows, columns = quantized.shape[-2:]
  for i in range(0, rows, block[0]):
    for j in range(0, columns, block[1]):
      part = np.s_[..., i:i + block[0], j:j + block[1]]
      out[part] = (quantized[part].astype(np.float32) *
                   scale[..., i // block[0], j // block[1]][..., None, None])
  return out


def _open(path: str, tensors, quantization_config, second_shard=()):
  quantized_checkpoints.write_folder(path, tensors, second_shard)
  return quantized_weights.dequantized(
      safetensors_io.open_weights(path),
      {"quantization_config": quantization_config})


class Fp8Test(absltest.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    # DeepSeek-V3's kv_a_proj has 576 rows: 5 blocks, the last one of 64.
    self.weights = {
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight":
            rng.normal(size=(576, 200)).astype(np.float32),
        "model.layers.0.mlp.experts.gate.weight":  # Stacked, 3 axes.
            rng.normal(size=(2, 130, 256)).astype(np.float32),
    }
    self.tensors = {"model.norm.weight": np.ones(200, ml_dtypes.bfloat16)}
    for name, weight in self.weights.items():
      q, s = quantized_checkpoints.fp8_quantize(weight, _BLOCK)
      self.tensors[name], self.tensors[name + "_scale_inv"] = q, s

  def test_partial_edge_blocks_equal_the_per_block_reference(self):
    # A weight and its scale in different shards.
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    weights = _open(self.create_tempdir().full_path, self.tensors,
                    quantized_checkpoints.FP8_CONFIG,
                    second_shard=(name + "_scale_inv",))
    self.assertCountEqual(weights, list(self.weights) + ["model.norm.weight"])
    self.assertCountEqual(weights.quantized_names, self.weights)
    for name, original in self.weights.items():
      got = weights[name]
      self.assertEqual((got.dtype, got.shape), (np.float32, original.shape))
      np.testing.assert_array_equal(got, fp8_reference(
          self.tensors[name], self.tensors[name + "_scale_inv"], _BLOCK))
      # float8_e4m3fn keeps 3 mantissa bits: within 1/16 of each value.
      np.testing.assert_allclose(got, original, rtol=1 / 16, atol=1e-2)
    # Unquantized tensors are passed through as stored.
    self.assertEqual(weights["model.norm.weight"].dtype, ml_dtypes.bfloat16)

  def test_one_scale_per_tensor_without_a_block_size(self):
    weight = np.random.default_rng(1).normal(size=(40, 24)).astype(np.float32)
    q, s = quantized_checkpoints.fp8_quantize(weight, None)
    weights = _open(self.create_tempdir().full_path,
                    {"w.weight": q, "w.weight_scale_inv": s,
                     "w.input_scale": np.ones((), np.float32)},
                    {"quant_method": "fp8"})
    self.assertEqual(list(weights), ["w.weight"])
    np.testing.assert_array_equal(weights["w.weight"],
                                  q.astype(np.float32) * s)

  def _refused(self, tensors, config, *pieces):
    with self.assertRaises(quantized_weights.QuantizationError) as caught:
      _open(self.create_tempdir().full_path, tensors, config)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    for piece in pieces:
      self.assertIn(piece, message)

  def test_bad_checkpoints_name_the_tensor(self):
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    q, s = self.tensors[name], self.tensors[name + "_scale_inv"]
    with self.subTest("a weight without its scale"):
      self._refused({name: q}, quantized_checkpoints.FP8_CONFIG, repr(name), "has no scale",
                    repr(name + "_scale_inv"))
    with self.subTest("a scale without its weight"):
      self._refused({name + "_scale_inv": s}, quantized_checkpoints.FP8_CONFIG,
                    repr(name + "_scale_inv"), "has no weight")
    with self.subTest("a block size that does not fit the scale"):
      self._refused({name: q, name + "_scale_inv": s},
                    {**quantized_checkpoints.FP8_CONFIG, "weight_block_size": [64, 128]},
                    repr(name + "_scale_inv"), "[5, 2]", "[9, 2]",
                    "weight_block_size=[64, 128]")
    with self.subTest("a scale of the wrong dtype"):
      self._refused({name: q, name + "_scale_inv": s.astype(np.int32)},
                    quantized_checkpoints.FP8_CONFIG, "I32", repr(name + "_scale_inv"))
    with self.subTest("a malformed block size"):
      self._refused({name: q, name + "_scale_inv": s},
                    {**quantized_checkpoints.FP8_CONFIG, "weight_block_size": [128]},
                    "weight_block_size=[128]", "two positive integers")
    with self.subTest("an unknown method"):
      self._refused({name: q, name + "_scale_inv": s},
                    {"quant_method": "awq"}, "quant_method='awq'",
                    "['fp8', 'mxfp4']")

  def test_quantized_tensors_without_a_config_are_refused(self):
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    q, s = self.tensors[name], self.tensors[name + "_scale_inv"]
    mxfp4 = "model.layers.0.mlp.experts.down_proj"
    blocks, scales = quantized_checkpoints.mxfp4_quantize(
        np.ones((1, 64, 8), np.float32))
    for tensors, found in (
        ({name: q}, f"{name!r} (in "),
        ({name + "_scale_inv": s}, "is an FP8 scale"),
        ({mxfp4 + "_blocks": blocks, mxfp4 + "_scales": scales},
         "holds MXFP4 blocks")):
      with self.subTest(found):
        path = self.create_tempdir().full_path
        quantized_checkpoints.write_folder(path, tensors)
        with self.assertRaisesRegex(quantized_weights.QuantizationError,
                                    "config.json has no quantization_config"
                                    ".*" + re.escape(found)):
          quantized_weights.dequantized(safetensors_io.open_weights(path), {})

  def test_an_unquantized_checkpoint_is_left_as_it_is(self):
    path = self.create_tempdir().full_path
    quantized_checkpoints.write_folder(path, {"w": np.ones(3, np.float32)})
    weights = safetensors_io.open_weights(path)
    self.assertIs(quantized_weights.dequantized(weights, {}), weights)


class Mxfp4Test(absltest.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(2)
    # [experts, in, out]: gate_up_proj [E, hidden, 2 * intermediate].
    self.weight = rng.normal(size=(3, 64, 40)).astype(np.float32)
    self.blocks, self.scales = quantized_checkpoints.mxfp4_quantize(self.weight)
    self.name = "model.layers.0.mlp.experts.gate_up_proj"

  def test_equals_transformers_unpacking(self):
    weights = _open(self.create_tempdir().full_path, {
        self.name + "_blocks": self.blocks,
        self.name + "_scales": self.scales,
        self.name + "_bias": np.zeros((3, 40), np.float32)},
                    {"quant_method": "mxfp4"},
                    second_shard=(self.name + "_scales",))
    self.assertCountEqual(weights, [self.name, self.name + "_bias"])
    got = weights[self.name]
    want = hf_mxfp4.convert_moe_packed_tensors(
        torch.from_numpy(self.blocks), torch.from_numpy(self.scales),
        dtype=torch.float32).numpy()
    self.assertEqual((got.dtype, got.shape), (np.float32, self.weight.shape))
    np.testing.assert_array_equal(got, want)
    # Within half FP4's widest step (2, between 4 and 6) times the group's
    # power of two, which is under a third of its largest value.
    error = np.abs(got - self.weight).reshape(3, 2, 32, 40)
    largest = np.abs(self.weight).reshape(3, 2, 32, 40).max(
        axis=2, keepdims=True)
    np.testing.assert_array_less(error, np.broadcast_to(largest / 3,
                                                        error.shape))

  def test_bad_checkpoints_name_the_tensor(self):
    blocks, scales = self.name + "_blocks", self.name + "_scales"
    cases = {
        "blocks without scales": ({blocks: self.blocks},
                                  (repr(blocks), "has no", repr(scales))),
        "scales without blocks": ({scales: self.scales},
                                  (repr(scales), "has no", repr(blocks))),
        "scales of the wrong shape": (
            {blocks: self.blocks, scales: self.scales[:, :-1]},
            (repr(blocks), "[3, 39, 2]", "[experts, rows, groups]")),
        "blocks of the wrong dtype": (
            {blocks: self.blocks.astype(np.int32), scales: self.scales},
            (repr(blocks), "I32")),
        "both quantized and not": (
            {blocks: self.blocks, scales: self.scales,
             self.name: self.weight}, (repr(self.name), "both")),
    }
    for case, (tensors, pieces) in cases.items():
      with self.subTest(case):
        with self.assertRaises(quantized_weights.QuantizationError) as caught:
          _open(self.create_tempdir().full_path, tensors,
                {"quant_method": "mxfp4"})
        for piece in pieces:
          self.assertIn(piece, str(caught.exception))


if __name__ == "__main__":
  absltest.main()
