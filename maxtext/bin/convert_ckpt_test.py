"""Tests the convert_ckpt binary: both directions, paths from the user's dir."""

import json
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import flagsaver
from flax import nnx
import numpy as np

from maxtext.bin import convert_ckpt
from maxtext.checkpoint import hf_convert
from maxtext.checkpoint import safetensors_io
from maxtext.common.model_config import ModelConfig
from maxtext.models import hf_weights
from maxtext.models import registry


def _write_hf_folder(folder: str) -> dict[str, np.ndarray]:
  cfg = ModelConfig.from_dict(dict(family="qwen3", vocab_size=64, num_layers=2,
                                   embed_dim=16, mlp_dim=32, num_heads=2,
                                   num_kv_heads=1, head_dim=8, qk_norm=True,
                                   tie_embeddings=False))
  tensors = hf_weights.to_hf_weights(
      registry.create_model(cfg, rngs=nnx.Rngs(0)))
  safetensors_io.write_weights(folder, lambda: iter(tensors.items()))
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf_convert.hf_config_dict(cfg), f)
  return tensors


class ConvertBinaryTest(absltest.TestCase):

  def test_round_trip_with_relative_paths(self):
    user_dir = self.create_tempdir().full_path
    want = _write_hf_folder(os.path.join(user_dir, "hf"))
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": user_dir}):
      with flagsaver.flagsaver(hf_dir="hf", out="ours", scan_layers=False):
        convert_ckpt.main(["convert_ckpt"])
      with flagsaver.flagsaver(to_hf=True, checkpoint="ours", out="back",
                               max_shard_size="2KB"):
        convert_ckpt.main(["convert_ckpt"])
    with open(os.path.join(user_dir, "ours", "model_config.json")) as f:
      self.assertFalse(json.load(f)["scan_layers"])
    got = safetensors_io.open_weights(os.path.join(user_dir, "back"))
    self.assertTrue(os.path.exists(os.path.join(
        user_dir, "back", "model.safetensors.index.json")))
    self.assertEqual(sorted(got), sorted(want))
    for name, array in want.items():
      np.testing.assert_array_equal(got[name], array, err_msg=name)

  def test_a_second_export_replaces_the_first_whole(self):
    user_dir = self.create_tempdir().full_path
    _write_hf_folder(os.path.join(user_dir, "hf"))
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": user_dir}):
      with flagsaver.flagsaver(hf_dir="hf", out="ours", scan_layers=False):
        convert_ckpt.main(["convert_ckpt"])
      for shard_size in ("2KB", "1GB"):  # Many files, then one.
        with flagsaver.flagsaver(to_hf=True, checkpoint="ours", out="back",
                                 max_shard_size=shard_size):
          convert_ckpt.main(["convert_ckpt"])
    names = sorted(os.listdir(os.path.join(user_dir, "back")))
    self.assertEqual([n for n in names if n.endswith(".safetensors")],
                     ["model.safetensors"])
    self.assertNotIn("model.safetensors.index.json", names)

  def test_outputs_that_would_lose_data_are_refused_in_one_line(self):
    user_dir = self.create_tempdir().full_path
    _write_hf_folder(os.path.join(user_dir, "hf"))
    # A training workdir: its config.json must survive.
    workdir = os.path.join(user_dir, "run")
    os.makedirs(os.path.join(workdir, "checkpoints", "1"))
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write('{"model": {}}')
    cases = [
        (dict(to_hf=True, checkpoint="run", out="run"),
         f"would overwrite its own input {workdir}"),
        (dict(to_hf=True, checkpoint="hf", out="run/hf"),
         f"is in the training workdir {workdir}"),
        (dict(hf_dir="hf", out="hf"), "would overwrite its own input"),
        (dict(hf_dir="hf", out="run"), "is in the training workdir"),
    ]
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": user_dir}):
      for values, fragment in cases:
        with flagsaver.flagsaver(**values):
          with self.assertRaises(SystemExit) as caught:
            convert_ckpt.main(["convert_ckpt"])
        message = caught.exception.code
        self.assertTrue(message.startswith(
            "convert_ckpt: error: ExportTargetError: "), message)
        self.assertIn(fragment, message)
        self.assertNotIn("\n", message)
    with open(os.path.join(workdir, "config.json")) as f:
      self.assertEqual(f.read(), '{"model": {}}')
    self.assertEqual(sorted(os.listdir(user_dir)), ["hf", "run"])

  def test_a_truncated_gguf_file_is_refused_in_one_line(self):
    user_dir = self.create_tempdir().full_path
    with open(os.path.join(user_dir, "model.gguf"), "wb") as f:
      # Magic, version 3, 1 tensor, 2 metadata entries, then nothing.
      f.write(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little")
              + (2).to_bytes(8, "little"))
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": user_dir}):
      with flagsaver.flagsaver(gguf="model.gguf", out="ckpt"):
        with self.assertRaises(SystemExit) as caught:
          convert_ckpt.main(["convert_ckpt"])
    self.assertEqual(
        caught.exception.code,
        f"convert_ckpt: error: GgufError: {user_dir}/model.gguf is truncated:"
        " its header needs byte 32, the file has 24.")
    self.assertEqual(os.listdir(user_dir), ["model.gguf"])
    with flagsaver.flagsaver(gguf="model.gguf", hf_dir="hf", out="ckpt"):
      with self.assertRaisesRegex(Exception, "--gguf converts one file"):
        convert_ckpt.main(["convert_ckpt"])

  def test_to_hf_needs_a_checkpoint(self):
    with flagsaver.flagsaver(to_hf=True, out="x"):
      with self.assertRaisesRegex(Exception, "--to_hf needs --checkpoint"):
        convert_ckpt.main(["convert_ckpt"])


if __name__ == "__main__":
  absltest.main()
