"""Hugging Face weight files: read lazily, write in shards.

Reading: `open_weights(hf_dir)` returns a read-only mapping name -> numpy
array over the folder's `*.safetensors` files (one file, or several listed by
`model.safetensors.index.json`). Only the headers are read up front; each
tensor is read from disk when it is looked up, so a caller that consumes and
drops tensors one at a time never holds more than one of them. Tensors go
through `safetensors.safe_open` (numpy framework); dtypes numpy lacks
(bfloat16, float8) are read from their byte range in the file and viewed as
`ml_dtypes` arrays.

Writing: `write_weights(out_dir, tensors, max_shard_size=...)` streams
tensors into `model.safetensors`, or `model-0000i-of-0000n.safetensors` with
a `model.safetensors.index.json` when more than one shard is needed. Shards
are planned from the tensors' shapes first, then every tensor is produced and
written straight to its file, so at most one tensor is held at a time.

Pickle-based checkpoints (`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`)
are refused without being opened: unpickling runs arbitrary code.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
import glob
import json
import math
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import safe_open

from maxtext.common import json_file

INDEX_FILENAME = "model.safetensors.index.json"
SINGLE_FILENAME = "model.safetensors"
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")

# safetensors dtype names <-> numpy dtypes.
_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
# Dtypes `safe_open(framework="numpy")` cannot return.
_RAW_DTYPES = ("BF16", "F8_E4M3", "F8_E5M2")
# The safetensors format's own limit on a header (its Rust reader refuses
# more), checked before a byte of it is read.
MAX_HEADER_BYTES = 100 * 1024 * 1024


class WeightsError(ValueError):
  """Weight files are missing, refused or malformed; names the path."""


def _read_header(path: str) -> tuple[dict, int]:
  """(the tensors' header entries, where the data starts) of one file,
  every entry checked to lie inside the file.

  Raises:
    WeightsError: the file is truncated, its header is too large, not a
      JSON object, or an entry's dtype, shape or offsets are malformed.
  """
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    prefix = f.read(8)
    if len(prefix) < 8:
      raise WeightsError(f"{path} is not a safetensors file: {size} bytes,"
                         " shorter than the 8-byte header length.")
    (length,) = struct.unpack("<Q", prefix)
    if length > min(MAX_HEADER_BYTES, size - 8):
      raise WeightsError(
          f"{path} declares a {length}-byte header, more than "
          + (f"the file's {size - 8} bytes after it (truncated?)"
             if length > size - 8 else f"the format's {MAX_HEADER_BYTES}"))
    try:
      header = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
      raise WeightsError(f"{path} has a malformed header: {e}") from None
  if not isinstance(header, dict):
    raise WeightsError(f"{path} has a malformed header: not a JSON object.")
  data_size = size - 8 - length
  entries = {}
  for name, entry in header.items():
    if name != "__metadata__":
      _check_entry(path, name, entry, data_size)
      entries[name] = entry
  return entries, 8 + length


def _check_entry(path: str, name: str, entry: Any, data_size: int) -> None:
  """One header entry: a known dtype, a shape of sizes >= 0, and offsets
  [begin, end] inside the data holding exactly that many bytes."""
  def bad(why):
    raise WeightsError(f"Tensor {name!r} in {path}: {why}.")

  if not isinstance(entry, dict):
    bad("its header entry is not a JSON object")
  dtype, shape = entry.get("dtype"), entry.get("shape")
  if dtype not in _DTYPES:
    bad(f"dtype {dtype!r} is not supported; supported: {sorted(_DTYPES)}")
  if not isinstance(shape, list) or not all(
      isinstance(n, int) and not isinstance(n, bool) and n >= 0
      for n in shape):
    bad(f"shape {shape!r} is not a list of sizes >= 0")
  offsets = entry.get("data_offsets")
  if not (isinstance(offsets, list) and len(offsets) == 2 and all(
      isinstance(n, int) and not isinstance(n, bool) for n in offsets)
          and 0 <= offsets[0] <= offsets[1] <= data_size):
    bad(f"data_offsets {offsets!r} do not lie inside the file's"
        f" {data_size} bytes of data (truncated?)")
  want = math.prod(shape) * _DTYPES[dtype].itemsize
  if offsets[1] - offsets[0] != want:
    bad(f"data_offsets {offsets!r} hold {offsets[1] - offsets[0]} bytes, but"
        f" {dtype} {shape} needs {want}")


def weight_files(hf_dir: str) -> list[str]:
  """The `*.safetensors` files holding the weights of `hf_dir`.

  Raises:
    WeightsError: no safetensors weights, or only pickle-format ones (refused
      without being opened), or an index that lists a missing file.
  """
  index_path = os.path.join(hf_dir, INDEX_FILENAME)
  if os.path.lexists(index_path):
    try:
      weight_map = json_file.read_object(index_path).get("weight_map")
    except json_file.JsonFileError as e:
      raise WeightsError(str(e)) from e
    if not weight_map or not isinstance(weight_map, dict):
      raise WeightsError(f"{index_path} has no 'weight_map' object.")
    bad = sorted({repr(n) for n in weight_map.values()
                  if not isinstance(n, str) or os.path.basename(n) != n or
                  n in ("", ".", "..")})
    if bad:
      raise WeightsError(f"{index_path} maps weights to {', '.join(bad[:3])},"
                         f" which are not file names in {hf_dir}.")
    names = set(weight_map.values())
    files = [os.path.join(hf_dir, name) for name in sorted(names)]
    for path in files:
      if not os.path.isfile(path):
        raise WeightsError(f"{index_path} lists {os.path.basename(path)}, "
                           f"which is not in {hf_dir}.")
    return files
  files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
  if files:
    return files
  pickles = sorted(os.path.basename(p) for pattern in PICKLE_PATTERNS
                   for p in glob.glob(os.path.join(hf_dir, pattern)))
  if pickles:
    raise WeightsError(
        f"{hf_dir} holds pickle-format weights {pickles}, which are refused: "
        "loading a pickle can run arbitrary code. Convert them to safetensors "
        "first (in a trusted environment: `AutoModelForCausalLM."
        "from_pretrained(dir).save_pretrained(out_dir)` writes safetensors).")
  raise WeightsError(f"No *.safetensors weights in {hf_dir}.")


class LazyWeights(Mapping):
  """Read-only name -> numpy array over safetensors files, read on lookup."""

  def __init__(self, files: Iterable[str]):
    self._where = {}  # name -> (path, header entry, data start)
    for path in files:
      entries, data_start = _read_header(path)
      for name, entry in entries.items():
        if name in self._where:
          raise WeightsError(f"Tensor {name!r} is in both {path} and "
                             f"{self._where[name][0]}.")
        self._where[name] = (path, entry, data_start)

  def __getitem__(self, name: str) -> np.ndarray:
    path, entry, data_start = self._where[name]
    shape = tuple(entry["shape"])
    if entry["dtype"] in _RAW_DTYPES:
      begin, end = entry["data_offsets"]
      with open(path, "rb") as f:
        f.seek(data_start + begin)
        data = f.read(end - begin)
      return np.frombuffer(data, _DTYPES[entry["dtype"]]).reshape(shape)
    with safe_open(path, framework="numpy") as f:
      return f.get_tensor(name)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._where[name][1]["shape"])

  def dtype(self, name: str) -> str:
    """The safetensors dtype name ("BF16", "F8_E4M3", "U8", ...)."""
    return self._where[name][1]["dtype"]

  def file(self, name: str) -> str:
    return self._where[name][0]

  def __iter__(self) -> Iterator[str]:
    return iter(self._where)

  def __len__(self) -> int:
    return len(self._where)


def open_weights(hf_dir: str) -> LazyWeights:
  """The weights of Hugging Face folder `hf_dir`, read lazily (see module)."""
  return LazyWeights(weight_files(hf_dir))


def parse_size(size: str | int) -> int:
  """Bytes of "5GB", "500MB", "10KiB" or an integer."""
  if isinstance(size, int):
    return size
  text = size.strip().upper()
  units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3,
           "MB": 10**6, "GB": 10**9, "B": 1}
  for unit, factor in units.items():
    if text.endswith(unit):
      return int(float(text[:-len(unit)]) * factor)
  return int(text)


def _plan_shards(specs: list[tuple[str, tuple[int, ...], np.dtype]],
                 max_shard_size: int) -> list[list[int]]:
  """Consecutive tensor indices per shard; a tensor larger than the limit
  gets a shard of its own."""
  shards, size = [[]], 0
  for i, (_, shape, dtype) in enumerate(specs):
    nbytes = math.prod(shape) * dtype.itemsize
    if shards[-1] and size + nbytes > max_shard_size:
      shards.append([])
      size = 0
    shards[-1].append(i)
    size += nbytes
  return shards


def _header_bytes(specs) -> bytes:
  header, offset = {"__metadata__": {"format": "pt"}}, 0
  for name, shape, dtype in specs:
    nbytes = math.prod(shape) * dtype.itemsize
    header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape),
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # Data starts 8-byte aligned.
  return struct.pack("<Q", len(text)) + text


def write_weights(out_dir: str,
                  tensors: Callable[[], Iterator[tuple[str, np.ndarray]]], *,
                  max_shard_size: int | str = "5GB") -> list[str]:
  """Writes Hugging Face safetensors weights; returns the files written.

  Args:
    out_dir: Output folder (created).
    tensors: Called twice: returns a fresh iterator of (name, array) in the
      same order each time. The first pass only reads shapes and dtypes (each
      array is dropped at once), the second writes the data.
    max_shard_size: Bytes per file at most ("5GB", "500MB" or an int); a
      single tensor larger than this gets a file of its own.

  Raises:
    WeightsError: the two passes disagree, or a dtype safetensors lacks.
  """
  limit = parse_size(max_shard_size)
  specs = []
  for name, array in tensors():
    if array.dtype not in _DTYPE_NAMES:
      raise WeightsError(f"Tensor {name!r} has dtype {array.dtype}, which "
                         "safetensors cannot store.")
    specs.append((name, tuple(array.shape), array.dtype))
  shards = _plan_shards(specs, limit)
  if len(shards) == 1:
    filenames = [SINGLE_FILENAME]
  else:
    filenames = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                 for i in range(len(shards))]
  os.makedirs(out_dir, exist_ok=True)
  produced = tensors()
  weight_map, total = {}, 0
  for filename, shard in zip(filenames, shards):
    shard_specs = [specs[i] for i in shard]
    with open(os.path.join(out_dir, filename), "wb") as f:
      f.write(_header_bytes(shard_specs))
      for want_name, shape, dtype in shard_specs:
        name, array = next(produced)
        if (name, tuple(array.shape), array.dtype) != (want_name, shape, dtype):
          raise WeightsError(f"Tensor {name!r} changed between passes.")
        f.write(np.ascontiguousarray(array).tobytes())
        weight_map[name] = filename
        total += array.nbytes
  if len(filenames) > 1:
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out_dir, INDEX_FILENAME), "w",
              encoding="utf-8") as f:
      json.dump(index, f, indent=2)
  return [os.path.join(out_dir, name) for name in filenames]
