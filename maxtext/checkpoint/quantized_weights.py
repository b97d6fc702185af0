"""Quantized Hugging Face checkpoints, dequantized as they are read.

Some official checkpoints store their weights quantized, named by
`config.json`'s `quantization_config.quant_method`:

- "fp8" (DeepSeek-V3, Kimi K2): a weight `X.weight` of dtype float8 (e4m3)
  beside its `X.weight_scale_inv`, one float scale per block of
  `weight_block_size` [rows, columns] (the last blocks of a dimension that
  the block does not divide are partial: DeepSeek-V3's 576-row `kv_a_proj`
  has 5 row blocks); the weight is `q * scale_inv` over each block. Without
  `weight_block_size` the scale is one number for the whole tensor. Norms,
  the router, the embeddings and the output head are stored unquantized.
- "mxfp4" (GPT-OSS): a mixture-of-experts weight `X` stored as `X_blocks`
  (uint8 [experts, rows, groups, 16]: 32 FP4 e2m1 values per group, two per
  byte, the low nibble first) and `X_scales` (uint8 [experts, rows, groups]:
  the group's power of two, biased by 127), transposed to
  [experts, groups * 32, rows] as transformers does; the other weights are
  stored unquantized.

`dequantized(weights, hf_config)` wraps the lazy name -> array mapping of
`safetensors_io.open_weights`: the scales are hidden, and each quantized
weight is dequantized to float32 when it is looked up (the multiply is done
in float32, as transformers does), so memory holds one weight and its scale
at a time; a weight and its scale may lie in different shards. Every pair is
checked from the headers before anything is read: a quantized weight without
its scale, a scale without its weight, or a scale grid that does not fit the
weight and the block size is a `QuantizationError` naming the tensor. So is
a checkpoint that holds quantized tensors (float8 weights, FP8 scales,
MXFP4 blocks) but whose config names no format: read as they are, they
would be wrong weights.
"""

from collections.abc import Iterator, Mapping
import math
from typing import Any

from absl import logging
import numpy as np

QUANT_METHODS = ("fp8", "mxfp4")
FP8_SCALE_SUFFIX = "_scale_inv"
# Activation scales of static FP8 schemes: nothing to dequantize in a weight.
FP8_ACTIVATION_SUFFIXES = (".input_scale", ".activation_scale")
MXFP4_BLOCKS_SUFFIX = "_blocks"
MXFP4_SCALES_SUFFIX = "_scales"
# FP4 e2m1 values by their 4-bit code.
FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)
MXFP4_GROUP = 32  # FP4 values per scale.
_SCALE_DTYPES = ("F32", "BF16", "F16")


class QuantizationError(ValueError):
  """A quantized checkpoint cannot be dequantized; names the tensor."""


def _quantization_config(hf_config: Mapping[str, Any],
                         source: str) -> dict[str, Any] | None:
  config = hf_config.get("quantization_config")
  if config is None:
    return None
  method = config.get("quant_method") if isinstance(config, dict) else None
  if method not in QUANT_METHODS:
    raise QuantizationError(
        f"{source}: quantization_config.quant_method={method!r} is not one"
        f" this converter reads; it reads {list(QUANT_METHODS)}.")
  return config


def _fp8_block(config: Mapping[str, Any], source: str) -> tuple[int, int] | None:
  block = config.get("weight_block_size")
  if block is None:
    return None
  if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(
      isinstance(n, int) and not isinstance(n, bool) and n > 0
      for n in block)):
    raise QuantizationError(
        f"{source}: quantization_config.weight_block_size={block!r} must be"
        " two positive integers [rows, columns].")
  return tuple(block)


def dequantized(weights: Mapping[str, np.ndarray], hf_config: Mapping[str, Any],
                *, source: str = "config.json") -> Mapping[str, np.ndarray]:
  """`weights` with its quantized tensors dequantized on lookup (see the
  module); `weights` itself when `hf_config` has no `quantization_config`.

  Args:
    weights: name -> array, with `dtype(name)` and `shape(name)` read from
      the headers (`safetensors_io.LazyWeights`).
    hf_config: The checkpoint's `config.json` (its `quantization_config`).
    source: Names the config in errors.

  Raises:
    QuantizationError: an unknown method, a bad block size, a tensor
      whose quantized pair is missing or does not fit, or a quantized
      tensor without a `quantization_config` (names the tensor).
  """
  config = _quantization_config(hf_config, source)
  if config is None:
    _check_unquantized(weights, source)
    return weights
  if config["quant_method"] == "fp8":
    view = _Fp8Weights(weights, _fp8_block(config, source))
  else:
    view = _Mxfp4Weights(weights)
  logging.info("%s: %s checkpoint; dequantizing %d weights to float32 as"
               " they are read.", source, config["quant_method"],
               len(view.quantized_names))
  return view


def _location(weights, name: str) -> str:
  """" (in <file>)" where `weights` knows the file holding `name`."""
  file = getattr(weights, "file", None)
  return f" (in {file(name)})" if file else ""


def _check_unquantized(weights: Mapping[str, np.ndarray], source: str) -> None:
  """Raises `QuantizationError` at the first tensor of `weights` in a
  quantized layout (the config names no format)."""
  dtype = getattr(weights, "dtype", None)
  for name in weights:
    if dtype is not None and dtype(name).startswith("F8"):
      found = f"is {dtype(name)}, an FP8 weight"
    elif name.endswith(FP8_SCALE_SUFFIX):
      found = "is an FP8 scale"
    elif (name.endswith(MXFP4_BLOCKS_SUFFIX) and name[:-len(
        MXFP4_BLOCKS_SUFFIX)] + MXFP4_SCALES_SUFFIX in weights):
      found = "holds MXFP4 blocks"
    else:
      continue
    raise QuantizationError(
        f"{source} has no quantization_config, but tensor {name!r}"
        f"{_location(weights, name)} {found}: a quantized checkpoint's"
        " config.json names its format in quantization_config.quant_method,"
        f" one of {list(QUANT_METHODS)}.")


class _Dequantized(Mapping):
  """name -> array over `base`: `_plan` maps each visible name to the
  base tensors it is made of; `_make` builds a quantized one."""

  def __init__(self, base):
    self._base = base
    self._quantized = {}  # visible name -> its base names
    # Ordered, with constant-time lookups (a checkpoint has ~10^5 names).
    self._visible = dict.fromkeys(self._plan())

  def _plan(self) -> Iterator[str]:
    raise NotImplementedError

  def _make(self, parts: tuple[str, ...]) -> np.ndarray:
    raise NotImplementedError

  def __getitem__(self, name: str) -> np.ndarray:
    if name in self._quantized:
      return self._make(self._quantized[name])
    if name not in self._visible:
      raise KeyError(name)
    return self._base[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._visible)

  @property
  def quantized_names(self) -> list[str]:
    """The names whose arrays are dequantized."""
    return list(self._quantized)

  def __len__(self) -> int:
    return len(self._visible)

  def _where(self, name: str) -> str:
    return _location(self._base, name)


class _Fp8Weights(_Dequantized):
  """FP8 block-scaled weights (module docstring)."""

  def __init__(self, base, block: tuple[int, int] | None):
    self._block = block
    super().__init__(base)

  def _grid(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    if self._block is None:
      return ()
    if len(shape) < 2:
      return None
    return tuple(shape[:-2]) + tuple(
        math.ceil(n / b) for n, b in zip(shape[-2:], self._block))

  def _plan(self) -> Iterator[str]:
    base = self._base
    scales = {name[:-len(FP8_SCALE_SUFFIX)]: name for name in base
              if name.endswith(FP8_SCALE_SUFFIX)}
    scale_names = set(scales.values())
    for weight, scale in scales.items():
      if weight not in base:
        raise QuantizationError(
            f"FP8 scale {scale!r}{self._where(scale)} has no weight"
            f" {weight!r} in the checkpoint.")
      shape, scale_shape = base.shape(weight), base.shape(scale)
      grid = self._grid(shape)
      if base.dtype(scale) not in _SCALE_DTYPES or (
          scale_shape != grid and not (grid == () and
                                       math.prod(scale_shape) == 1)):
        raise QuantizationError(
            f"FP8 scale {scale!r}{self._where(scale)} is {base.dtype(scale)}"
            f" {list(scale_shape)}, but weight {weight!r} {list(shape)} with"
            f" weight_block_size={list(self._block or ())} needs a float"
            f" scale of shape {list(grid) if grid is not None else '?'}.")
      self._quantized[weight] = (weight, scale)
    for name in base:
      if name in scale_names or name.endswith(FP8_ACTIVATION_SUFFIXES):
        continue
      if name not in self._quantized and base.dtype(name).startswith("F8"):
        raise QuantizationError(
            f"FP8 weight {name!r}{self._where(name)} has no scale"
            f" {name + FP8_SCALE_SUFFIX!r} in the checkpoint.")
      yield name

  def _make(self, parts: tuple[str, ...]) -> np.ndarray:
    weight, scale = (np.asarray(self._base[p], np.float32) for p in parts)
    if self._block is None:
      return weight * scale.reshape(())
    for axis, size in zip((-2, -1), self._block):
      scale = np.repeat(scale, size, axis=axis)
    rows, columns = weight.shape[-2:]
    return weight * scale[..., :rows, :columns]


class _Mxfp4Weights(_Dequantized):
  """MXFP4 expert weights (module docstring)."""

  def _plan(self) -> Iterator[str]:
    base = self._base
    blocks = {name[:-len(MXFP4_BLOCKS_SUFFIX)] for name in base
              if name.endswith(MXFP4_BLOCKS_SUFFIX)}
    scales = {name[:-len(MXFP4_SCALES_SUFFIX)] for name in base
              if name.endswith(MXFP4_SCALES_SUFFIX)}
    for name in sorted(blocks ^ scales):
      have, lack = ((MXFP4_BLOCKS_SUFFIX, MXFP4_SCALES_SUFFIX)
                    if name in blocks else
                    (MXFP4_SCALES_SUFFIX, MXFP4_BLOCKS_SUFFIX))
      raise QuantizationError(
          f"MXFP4 tensor {name + have!r}{self._where(name + have)} has no"
          f" {name + lack!r} in the checkpoint.")
    for name in sorted(blocks):
      block_name, scale_name = (name + MXFP4_BLOCKS_SUFFIX,
                                name + MXFP4_SCALES_SUFFIX)
      shape, scale_shape = base.shape(block_name), base.shape(scale_name)
      if (len(shape) != 4 or shape[-1] != MXFP4_GROUP // 2 or
          scale_shape != shape[:-1] or base.dtype(block_name) != "U8" or
          base.dtype(scale_name) != "U8"):
        raise QuantizationError(
            f"MXFP4 tensors {block_name!r} {base.dtype(block_name)}"
            f" {list(shape)} and {scale_name!r} {base.dtype(scale_name)}"
            f" {list(scale_shape)}{self._where(block_name)} must be uint8"
            f" [experts, rows, groups, {MXFP4_GROUP // 2}] and uint8"
            " [experts, rows, groups].")
      if name in base:
        raise QuantizationError(
            f"Tensor {name!r} is in the checkpoint both unquantized and as"
            f" MXFP4 {block_name!r}.")
      self._quantized[name] = (block_name, scale_name)
    hidden = {part for parts in self._quantized.values() for part in parts}
    yield from (name for name in base if name not in hidden)
    yield from self._quantized

  def _make(self, parts: tuple[str, ...]) -> np.ndarray:
    blocks, scales = (np.asarray(self._base[p]) for p in parts)
    values = np.empty(blocks.shape[:-1] + (MXFP4_GROUP,), np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    experts, rows, groups = scales.shape
    return values.reshape(experts, rows, groups * MXFP4_GROUP).transpose(
        0, 2, 1)

