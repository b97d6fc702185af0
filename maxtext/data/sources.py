"""Record sources: random access to the records of files of one format.

Every source is a sequence of raw records (`len(source)`, `source[i]`) that
also says where record `i` is (`source.where(i)`, e.g. "/data/a.jsonl:17"),
its size in bytes when known before reading (`source.size(i)`, else None),
and how to parse it (`source.payload`):
  * "text"  the record is UTF-8 text (plain text files);
  * "json"  the record is one UTF-8 JSON object (JSONL lines, ArrayRecord
            records);
  * "value" the record is the value of the text field already (Parquet and
            Arrow columns).

Formats (`SOURCE_KINDS`):
  text         plain text files; records are files, paragraphs (runs of
               non-blank lines) or non-blank lines (`text_unit`);
  jsonl        JSON Lines; each non-blank line is a record;
  parquet      Parquet files; each row is a record (one column is read, a row
               group at a time, the last few kept in memory);
  arrayrecord  ArrayRecord files of JSON objects (grain's
               ArrayRecordDataSource);
  arrow        Hugging Face `datasets` saved with `save_to_disk` (folders;
               memory-mapped Arrow files).

Sources are built in the main process (indexing reads every text and JSONL
file once, a chunk at a time: memory grows with the number of records, not
the size of the files) and pickled into grain's worker processes, where they reopen
their files lazily.
"""

from collections.abc import Sequence
import collections
import glob
import os
from typing import Any

from array_record.python import array_record_module
import grain
import numpy as np
import pyarrow
from pyarrow import parquet

SOURCE_KINDS = ("text", "jsonl", "parquet", "arrayrecord", "arrow")
TEXT_UNITS = ("file", "paragraph", "line")

# A line of only whitespace bytes (" ", and "\t\n\v\f\r": 9 to 13) is blank.
_SPACE, _TAB, _CONTROL_SPACES = ord(" "), ord("\t"), 5
# Text and JSONL files are indexed this many bytes at a time.
_INDEX_CHUNK_BYTES = 1 << 20
# Row groups of a Parquet source kept decoded per process.
_CACHED_ROW_GROUPS = 4


def expand_patterns(patterns: str | Sequence[str], *,
                    directories: bool = False) -> list[str]:
  """Paths matching glob `patterns` (a comma-separated string or a list).

  Args:
    patterns: Glob patterns; `**` matches across folders.
    directories: Match folders instead of files.

  Returns:
    Sorted, de-duplicated paths.

  Raises:
    ValueError: no pattern is given.
    FileNotFoundError: a pattern matches nothing (the error names it).
  """
  if isinstance(patterns, str):
    patterns = [p.strip() for p in patterns.split(",")]
  patterns = [p for p in patterns if p]
  if not patterns:
    raise ValueError("No files given; set config.data.files.")
  keep = os.path.isdir if directories else os.path.isfile
  kind = "folder" if directories else "file"
  paths = set()
  for pattern in patterns:
    found = glob.glob(os.path.expanduser(pattern), recursive=True)
    matches = [p for p in found if keep(p)]
    if not matches:
      others = (f": {found[:3]} {'is' if len(found) == 1 else 'are'} not"
                f" {'a folder' if directories else 'a regular file'}"
                if found else "")
      raise FileNotFoundError(f"Pattern {pattern!r} matches no {kind}"
                              f"{others}.")
    paths.update(matches)
  return sorted(paths)


class _ByteRecords:
  """Records that are byte ranges of files (text and JSONL sources).

  Attributes:
    paths: The files.
    payload: How records parse ("text" or "json").
  """

  def __init__(self, paths: Sequence[str], payload: str, file_index,
               starts, ends, lines):
    self.paths = list(paths)
    self.payload = payload
    self._file_index = np.asarray(file_index, np.int32)
    self._starts = np.asarray(starts, np.int64)
    self._ends = np.asarray(ends, np.int64)
    self._lines = np.asarray(lines, np.int64)

  def __len__(self) -> int:
    return len(self._starts)

  def size(self, index: int) -> int:
    return int(self._ends[index] - self._starts[index])

  def where(self, index: int) -> str:
    path = self.paths[self._file_index[index]]
    return f"{path}:{self._lines[index]}"

  def __getitem__(self, index: int) -> bytes:
    with open(self.paths[self._file_index[index]], "rb") as f:
      f.seek(int(self._starts[index]))
      return f.read(self.size(index))


def _line_table(path: str, chunk_bytes: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(starts, ends, is_blank) of every line of file `path` (ends exclude
  "\\n"; a last line without "\\n" counts), read `chunk_bytes` at a time:
  memory is one chunk's working arrays plus the index itself."""
  starts, ends, blank = [], [], []
  offset = 0  # Of the chunk in the file.
  line_start, line_solid = 0, False  # The line the next chunk continues.
  with open(path, "rb") as f:
    while chunk := f.read(chunk_bytes):
      data = np.frombuffer(chunk, np.uint8)
      newlines = np.flatnonzero(data == ord("\n"))
      # Non-whitespace bytes before each position of the chunk (uint8
      # arithmetic wraps: bytes below 9 are not whitespace).
      whitespace = data == _SPACE
      whitespace |= (data - np.uint8(_TAB)) < _CONTROL_SPACES
      solid = np.zeros(len(data) + 1, np.int32)
      np.cumsum(~whitespace, dtype=np.int32, out=solid[1:])
      del whitespace
      if len(newlines):
        local_starts = np.concatenate([[0], newlines[:-1] + 1])
        has_solid = solid[newlines] > solid[local_starts]
        has_solid[0] |= line_solid
        line_starts = offset + local_starts
        line_starts[0] = line_start
        starts.append(line_starts)
        ends.append(offset + newlines)
        blank.append(~has_solid)
        line_start = offset + int(newlines[-1]) + 1
        line_solid = bool(solid[-1] > solid[newlines[-1] + 1])
      else:
        line_solid |= bool(solid[-1] > 0)
      offset += len(data)
  if offset > line_start:  # The last line has no newline.
    starts.append(np.array([line_start]))
    ends.append(np.array([offset]))
    blank.append(np.array([not line_solid]))
  if not starts:
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)
  return (np.concatenate(starts).astype(np.int64),
          np.concatenate(ends).astype(np.int64), np.concatenate(blank))


def _index_file(path: str, unit: str, chunk_bytes: int | None = None):
  """(starts, ends, first line numbers) of the records of one file, read
  `chunk_bytes` (default `_INDEX_CHUNK_BYTES`) at a time."""
  if unit == "file":
    return np.array([0]), np.array([os.path.getsize(path)]), np.array([1])
  starts, ends, blank = _line_table(path, chunk_bytes or _INDEX_CHUNK_BYTES)
  line_numbers = np.arange(1, len(starts) + 1)
  if unit == "line":
    keep = ~blank
    return starts[keep], ends[keep], line_numbers[keep]
  # Paragraphs: maximal runs of non-blank lines.
  solid = (~blank).astype(np.int8)
  edges = np.diff(np.concatenate([[0], solid, [0]]))
  first, last = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
  return starts[first], ends[last], line_numbers[first]


def _byte_records(paths: Sequence[str], payload: str,
                  unit: str) -> _ByteRecords:
  columns = [[], [], [], []]
  for i, path in enumerate(paths):
    starts, ends, lines = _index_file(path, unit)
    for column, values in zip(columns, (np.full(len(starts), i), starts, ends,
                                        lines)):
      column.append(values)
  return _ByteRecords(paths, payload, *(np.concatenate(c) for c in columns))


class ParquetRecords:
  """Rows of one column of Parquet files (with `extra_field`, of two: each
  row a dict {field: value, extra_field: value})."""

  payload = "value"

  def __init__(self, paths: Sequence[str], field: str, extra_field: str = ""):
    self.paths = list(paths)
    self.field = field
    self.extra_field = extra_field
    counts = []  # Rows per row group, over all files in order.
    # (file index, row group index, its first row in the file) of each group.
    self._groups = []
    for i, path in enumerate(self.paths):
      metadata = parquet.ParquetFile(path).metadata
      # Top-level columns (`schema.names` lists nested leaves).
      names = metadata.schema.to_arrow_schema().names
      for name, key in ((field, "text_field"), (extra_field, "image_field")):
        if name and name not in names:
          raise ValueError(
              f"Parquet file {path!r} has no column {name!r} (set"
              f" data.{key}); its columns: {names}.")
      first_row = 0
      for g in range(metadata.num_row_groups):
        counts.append(metadata.row_group(g).num_rows)
        self._groups.append((i, g, first_row))
        first_row += counts[-1]
    self._group_starts = np.concatenate([[0], np.cumsum(counts)]).astype(
        np.int64)
    self._cache = collections.OrderedDict()
    self._files = {}

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_cache"], state["_files"] = collections.OrderedDict(), {}
    return state

  def __len__(self) -> int:
    return int(self._group_starts[-1])

  def size(self, index: int) -> None:
    del index

  def _locate(self, index: int) -> tuple[int, int]:
    group = int(np.searchsorted(self._group_starts, index, side="right")) - 1
    return group, index - int(self._group_starts[group])

  def where(self, index: int) -> str:
    group, row = self._locate(index)
    file_index, _, first_row = self._groups[group]
    return f"{self.paths[file_index]} row {first_row + row}"

  def __getitem__(self, index: int) -> Any:
    group, row = self._locate(index)
    values = self._cache.get(group)
    if values is None:
      file_index, row_group, _ = self._groups[group]
      f = self._files.get(file_index)
      if f is None:
        f = self._files[file_index] = parquet.ParquetFile(
            self.paths[file_index])
      columns = [self.field] + ([self.extra_field] if self.extra_field
                                else [])
      table = f.read_row_group(row_group, columns=columns)
      values = (table.column(0).to_pylist() if not self.extra_field
                else table.to_pylist())
      self._cache[group] = values
      if len(self._cache) > _CACHED_ROW_GROUPS:
        self._cache.popitem(last=False)
    else:
      self._cache.move_to_end(group)
    return values[row]


class ArrayRecordRecords:
  """Records of ArrayRecord files, each one JSON object."""

  payload = "json"

  def __init__(self, paths: Sequence[str]):
    self.paths = list(paths)
    counts = []
    for path in self.paths:
      reader = array_record_module.ArrayRecordReader(path)
      counts.append(reader.num_records())
      reader.close()
    self._file_starts = np.concatenate([[0], np.cumsum(counts)]).astype(
        np.int64)
    self._source = None

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_source"] = None
    return state

  def __len__(self) -> int:
    return int(self._file_starts[-1])

  def size(self, index: int) -> None:
    del index

  def where(self, index: int) -> str:
    file_index = int(np.searchsorted(self._file_starts, index,
                                     side="right")) - 1
    return (f"{self.paths[file_index]} record"
            f" {index - int(self._file_starts[file_index])}")

  def __getitem__(self, index: int) -> bytes:
    if self._source is None:
      self._source = grain.sources.ArrayRecordDataSource(self.paths)
    return self._source[index]


class ArrowRecords:
  """Rows of one column of `datasets.Dataset`s saved with `save_to_disk`
  (with `extra_field`, of two: each row a dict {field: value, extra_field:
  value}, e.g. a conversation and its images)."""

  payload = "value"

  def __init__(self, paths: Sequence[str], field: str, extra_field: str = ""):
    self.paths = list(paths)
    self.field = field
    self.extra_field = extra_field
    counts = [len(self._column(path)) for path in self.paths]
    self._dataset_starts = np.concatenate([[0], np.cumsum(counts)]).astype(
        np.int64)
    self._columns = {}

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_columns"] = {}
    return state

  def _column(self, path: str) -> pyarrow.ChunkedArray | pyarrow.Table:
    # Imported here: `datasets` is heavy and only this source needs it.
    import datasets  # pylint: disable=g-import-not-at-top

    try:
      dataset = datasets.load_from_disk(path)
    except FileNotFoundError as e:
      raise ValueError(
          f"{path!r} is not a dataset saved with `save_to_disk`: {e}") from e
    if isinstance(dataset, datasets.DatasetDict):
      raise ValueError(
          f"{path!r} holds a DatasetDict; point data.files at one of its"
          f" splits: {[os.path.join(path, s) for s in dataset]}.")
    for name, key in ((self.field, "text_field"),
                      (self.extra_field, "image_field")):
      if name and name not in dataset.column_names:
        raise ValueError(
            f"Dataset {path!r} has no column {name!r} (set data.{key}); its"
            f" columns: {dataset.column_names}.")
    if self.extra_field:
      return dataset.data.table.select([self.field, self.extra_field])
    return dataset.data.column(self.field)

  def __len__(self) -> int:
    return int(self._dataset_starts[-1])

  def size(self, index: int) -> None:
    del index

  def _locate(self, index: int) -> tuple[int, int]:
    i = int(np.searchsorted(self._dataset_starts, index, side="right")) - 1
    return i, index - int(self._dataset_starts[i])

  def where(self, index: int) -> str:
    i, row = self._locate(index)
    return f"{self.paths[i]} row {row}"

  def __getitem__(self, index: int) -> Any:
    i, row = self._locate(index)
    column = self._columns.get(i)
    if column is None:
      column = self._columns[i] = self._column(self.paths[i])
    if self.extra_field:
      return column.slice(row, 1).to_pylist()[0]
    return column[row].as_py()


def make_file_source(kind: str, patterns: str | Sequence[str], *,
                     text_field: str, text_unit: str, image_field: str = ""):
  """The record source of `kind` over the files matching `patterns`
  (Parquet and Arrow rows with `image_field`: {text_field, image_field}
  dicts).

  Raises:
    ValueError: `kind` or `text_unit` is unknown, or the files lack
      `text_field` (the error names the file and its fields).
    FileNotFoundError: a pattern matches nothing.
  """
  if kind not in SOURCE_KINDS:
    raise ValueError(f"Unknown source {kind!r}; valid: {SOURCE_KINDS}.")
  if text_unit not in TEXT_UNITS:
    raise ValueError(
        f"data.text_unit={text_unit!r} is invalid; valid: {TEXT_UNITS}.")
  paths = expand_patterns(patterns, directories=kind == "arrow")
  if kind == "text":
    return _byte_records(paths, "text", text_unit)
  if kind == "jsonl":
    return _byte_records(paths, "json", "line")
  if kind == "parquet":
    return ParquetRecords(paths, text_field, image_field)
  if kind == "arrayrecord":
    return ArrayRecordRecords(paths)
  return ArrowRecords(paths, text_field, image_field)
