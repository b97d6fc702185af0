"""Reading GGUF files (llama.cpp's format) with numpy: the metadata, the
tensor directory, and each tensor dequantized to float32.

Layout (versions 2 and 3, little-endian): b"GGUF", uint32 version, uint64
tensor count, uint64 metadata count; each metadata entry a string key, a
uint32 value type and the value; each tensor's name, uint32 dimension
count, uint64 dimensions (fastest first), uint32 ggml type and uint64
offset into the data section, which starts at the next multiple of
`general.alignment` (default 32). A string is a uint64 byte count and UTF-8
bytes; an array a uint32 item type, a uint64 count and the items.

Tensor types read (`TENSOR_TYPES`): F32, F16, BF16 and the 32-weight block
types Q8_0 (f16 scale d, 32 int8: w = d q), Q4_0 (d, 16 bytes of 4-bit q,
the low nibbles first: w = d (q - 8)) and Q4_1 (d, minimum m, 16 bytes:
w = d q + m). A tensor's array has its dimensions slowest first (the
reverse of the file's order), as PyTorch and numpy lay weights out.
"""

from collections.abc import Mapping
import dataclasses
import os
import struct
from typing import Any

import numpy as np

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
# Metadata value types: scalars as numpy dtypes; 8 string, 9 array.
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4",
            6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_BOOL, _STRING, _ARRAY = 7, 8, 9


class GgufError(ValueError):
  """The file is not a GGUF file we read; the message names the file and
  what is wrong."""


def _dequantize_blocks(raw: np.ndarray, block_bytes: int, kind: str
                       ) -> np.ndarray:
  blocks = raw.reshape(-1, block_bytes)
  d = blocks[:, :2].copy().view("<f2").astype(np.float32)
  if kind == "Q8_0":
    return d * blocks[:, 2:].copy().view(np.int8).astype(np.float32)
  start = 4 if kind == "Q4_1" else 2
  nibbles = blocks[:, start:]
  q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(
      np.float32)
  if kind == "Q4_0":
    return d * (q - 8.0)
  m = blocks[:, 2:4].copy().view("<f2").astype(np.float32)
  return d * q + m


def _f32(raw):
  return raw.view("<f4").astype(np.float32)


def _f16(raw):
  return raw.view("<f2").astype(np.float32)


def _bf16(raw):
  return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


@dataclasses.dataclass(frozen=True)
class _TensorType:
  name: str
  block_weights: int
  block_bytes: int


# ggml type id -> how its data is laid out.
TENSOR_TYPES = {
    0: _TensorType("F32", 1, 4),
    1: _TensorType("F16", 1, 2),
    2: _TensorType("Q4_0", 32, 18),
    3: _TensorType("Q4_1", 32, 20),
    8: _TensorType("Q8_0", 32, 34),
    30: _TensorType("BF16", 1, 2),
}
_PLAIN = {"F32": _f32, "F16": _f16, "BF16": _bf16}
_BY_NAME = {kind.name: kind for kind in TENSOR_TYPES.values()}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """A tensor of the file: its name, shape (slowest dimension first), ggml
  type name and byte range in the file."""

  name: str
  shape: tuple[int, ...]
  type_name: str
  start: int
  nbytes: int


class _Reader:
  """Reads the header fields of `data` in order, naming `path` in errors."""

  def __init__(self, data: np.ndarray, path: str):
    self.data, self.path, self.pos = data, path, 0

  def take(self, count: int) -> np.ndarray:
    if self.pos + count > len(self.data):
      raise GgufError(f"{self.path} is truncated: its header needs byte"
                      f" {self.pos + count}, the file has {len(self.data)}.")
    out = self.data[self.pos:self.pos + count]
    self.pos += count
    return out

  def scalar(self, dtype: str) -> Any:
    size = np.dtype(dtype).itemsize
    return self.take(size).view(dtype)[0].item()

  def string(self) -> str:
    raw = self.take(self.scalar("<u8")).tobytes()
    try:
      return raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise GgufError(f"{self.path}: a string at byte {self.pos} is not"
                      f" UTF-8 ({e}).") from e

  def value(self, kind: int) -> Any:
    if kind == _STRING:
      return self.string()
    if kind == _ARRAY:
      item_kind, count = self.scalar("<u4"), self.scalar("<u8")
      if item_kind in _SCALARS:
        dtype = np.dtype(_SCALARS[item_kind])
        values = self.take(count * dtype.itemsize).view(dtype).tolist()
        return [bool(v) for v in values] if item_kind == _BOOL else values
      return [self.value(item_kind) for _ in range(count)]
    if kind not in _SCALARS:
      raise GgufError(f"{self.path}: metadata value type {kind} at byte"
                      f" {self.pos} is not a GGUF type (0-12).")
    value = self.scalar(_SCALARS[kind])
    return bool(value) if kind == _BOOL else value


class GgufFile:
  """A GGUF file, memory-mapped: `metadata` (key -> value), `tensors`
  (name -> `TensorInfo`, in file order) and `tensor(name)`.

  Raises (on opening):
    GgufError: the file is missing, empty, truncated, not GGUF, of another
      version, or holds a tensor type we do not read (names the valid
      ones).
  """

  def __init__(self, path: str):
    self.path = path
    if not os.path.isfile(path):
      raise GgufError(f"{path} does not exist or is not a file.")
    if os.path.getsize(path) == 0:
      raise GgufError(f"{path} is empty; expected a GGUF file.")
    self._data = np.memmap(path, dtype=np.uint8, mode="r")
    reader = _Reader(self._data, path)
    magic = reader.take(4).tobytes()
    if magic != _MAGIC:
      raise GgufError(f"{path} is not a GGUF file (it starts with"
                      f" {magic!r}, not {_MAGIC!r}).")
    version = reader.scalar("<u4")
    if version not in _VERSIONS:
      raise GgufError(f"{path} is GGUF version {version}; versions"
                      f" {_VERSIONS} are read.")
    tensor_count, metadata_count = reader.scalar("<u8"), reader.scalar("<u8")
    self.metadata: dict[str, Any] = {}
    for _ in range(metadata_count):
      key = reader.string()
      self.metadata[key] = reader.value(reader.scalar("<u4"))
    infos = []
    for _ in range(tensor_count):
      name = reader.string()
      dims = [reader.scalar("<u8") for _ in range(reader.scalar("<u4"))]
      infos.append((name, tuple(reversed(dims)), reader.scalar("<u4"),
                    reader.scalar("<u8")))
    alignment = int(self.metadata.get("general.alignment",
                                      _DEFAULT_ALIGNMENT))
    base = -(-reader.pos // alignment) * alignment
    self.tensors: dict[str, TensorInfo] = {}
    for name, shape, type_id, offset in infos:
      self.tensors[name] = self._info(name, shape, type_id, base + offset)

  def _info(self, name: str, shape: tuple[int, ...], type_id: int,
            start: int) -> TensorInfo:
    kind = TENSOR_TYPES.get(type_id)
    if kind is None:
      valid = sorted(_BY_NAME)
      raise GgufError(f"{self.path}: tensor {name} has ggml type {type_id},"
                      f" which is not read; valid types: {valid}.")
    count = int(np.prod(shape, dtype=np.int64))
    if count % kind.block_weights:
      raise GgufError(f"{self.path}: tensor {name} of shape {shape} is not"
                      f" whole {kind.name} blocks of {kind.block_weights}.")
    nbytes = count // kind.block_weights * kind.block_bytes
    if start + nbytes > len(self._data):
      raise GgufError(f"{self.path} is truncated: tensor {name} needs bytes"
                      f" {start}..{start + nbytes}, the file has"
                      f" {len(self._data)}.")
    return TensorInfo(name, shape, kind.name, start, nbytes)

  def tensor(self, name: str) -> np.ndarray:
    """Tensor `name` as float32 of its shape (dequantized)."""
    info = self.tensors[name]
    raw = self._data[info.start:info.start + info.nbytes]
    plain = _PLAIN.get(info.type_name)
    if plain is not None:
      flat = plain(np.asarray(raw))
    else:
      flat = _dequantize_blocks(np.asarray(raw),
                                _BY_NAME[info.type_name].block_bytes,
                                info.type_name)
    return flat.reshape(info.shape)
