"""Test helper: quantized Hugging Face checkpoints in the published layouts.

Reference quantizers (numpy) for FP8 block-scaled weights (DeepSeek-V3,
Kimi K2) and MXFP4 expert weights (GPT-OSS), and `quantize_folder`, which
rewrites a folder saved by `save_pretrained` into such a checkpoint.
Library code never imports this module.
"""

import json
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from maxtext.checkpoint import quantized_weights
from maxtext.checkpoint import safetensors_io

FP8_MAX = 448.0  # Largest float8_e4m3fn value.
# DeepSeek-V3's config.json.
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3",
              "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
MXFP4_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router",
    "model.embed_tokens", "lm_head"]}


def fp8_quantize(weight: np.ndarray, block: tuple[int, int] | None):
  """(float8 weight, float32 scale_inv) as DeepSeek-V3 publishes them: one
  scale per block of the last two axes (partial at the edges), or one for
  the tensor."""
  if block is None:
    scale = np.float32(np.abs(weight).max() / FP8_MAX)
    return (weight / scale).astype(ml_dtypes.float8_e4m3fn), np.array(
        scale, np.float32)
  rows, columns = weight.shape[-2:]
  grid = (-(-rows // block[0]), -(-columns // block[1]))
  scale = np.zeros(weight.shape[:-2] + grid, np.float32)
  quantized = np.zeros(weight.shape, ml_dtypes.float8_e4m3fn)
  for i in range(grid[0]):
    for j in range(grid[1]):
      part = np.s_[..., i * block[0]:(i + 1) * block[0],
                   j * block[1]:(j + 1) * block[1]]
      s = np.abs(weight[part]).max(axis=(-2, -1)) / FP8_MAX
      scale[..., i, j] = s
      quantized[part] = (weight[part] / s[..., None, None]).astype(
          ml_dtypes.float8_e4m3fn)
  return quantized, scale


def mxfp4_quantize(weight: np.ndarray):
  """(blocks, scales) of expert weights [experts, in, out] as GPT-OSS
  publishes them: rows are `out`, 32 values of `in` per group, each rounded
  to the nearest FP4 value after dividing by the group's power of two."""
  values = np.swapaxes(weight, 1, 2)  # [experts, rows, in]
  experts, rows, width = values.shape
  groups = values.reshape(experts, rows, width // 32, 32)
  exponent = np.ceil(np.log2(np.maximum(np.abs(groups).max(-1), 1e-30) / 6))
  scaled = groups / np.exp2(exponent)[..., None]
  codes = np.abs(scaled[..., None] -
                 quantized_weights.FP4_VALUES).argmin(-1).astype(np.uint8)
  blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
  return blocks, (exponent + 127).astype(np.uint8)


def read_folder(path: str) -> dict[str, np.ndarray]:
  """Every tensor of the folder's safetensors files."""
  tensors = {}
  for name in sorted(os.listdir(path)):
    if name.endswith(".safetensors"):
      tensors.update(load_file(os.path.join(path, name)))
  return tensors


def write_folder(path: str, tensors: dict[str, np.ndarray],
                 second_shard: tuple[str, ...] = ()) -> None:
  """Writes `tensors` as two shards with an index (`second_shard` names the
  tensors of the second), replacing the folder's safetensors files."""
  for name in os.listdir(path):
    if name.endswith(".safetensors") or name == safetensors_io.INDEX_FILENAME:
      os.remove(os.path.join(path, name))
  shards = {"model-00001-of-00002.safetensors": {
      k: v for k, v in tensors.items() if k not in second_shard},
            "model-00002-of-00002.safetensors": {
                k: tensors[k] for k in second_shard}}
  weight_map = {}
  for filename, shard in shards.items():
    if shard:
      save_file(shard, os.path.join(path, filename), metadata={"format": "pt"})
      weight_map.update(dict.fromkeys(shard, filename))
  with open(os.path.join(path, safetensors_io.INDEX_FILENAME), "w",
            encoding="utf-8") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)


def quantize_folder(path: str, method: str, **config_changes) -> list[str]:
  """Rewrites a `save_pretrained` folder as the method's published
  checkpoint: "fp8" quantizes every `*_proj.weight` matrix (the norms,
  router, embeddings and head stay), "mxfp4" the experts' `gate_up_proj`
  and `down_proj`. Each quantized weight's scale goes to the second shard.
  `config_changes` are set in config.json. Returns the quantized names."""
  out, second, quantized = {}, [], []
  for name, array in read_folder(path).items():
    if method == "fp8" and name.endswith("_proj.weight") and array.ndim == 2:
      out[name], out[name + "_scale_inv"] = fp8_quantize(array, (128, 128))
      second.append(name + "_scale_inv")
    elif method == "mxfp4" and name.endswith(("experts.gate_up_proj",
                                              "experts.down_proj")):
      out[name + "_blocks"], out[name + "_scales"] = mxfp4_quantize(array)
      second.append(name + "_scales")
    else:
      out[name] = array
      continue
    quantized.append(name)
  write_folder(path, out, tuple(second))
  config_path = os.path.join(path, "config.json")
  with open(config_path, encoding="utf-8") as f:
    config = json.load(f)
  config["quantization_config"] = {"fp8": FP8_CONFIG,
                                   "mxfp4": MXFP4_CONFIG}[method]
  config.update(config_changes)
  with open(config_path, "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2)
  return quantized
