"""Tests for maxtext.data.sources: every format, read back as written."""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized
from array_record.python import array_record_module
import datasets
import pyarrow
from pyarrow import parquet

from maxtext.data import sources

_TEXTS = ["To be, or not to be", "that is the question:", "Whether 'tis nobler",
          "in the mind to suffer", "The slings and arrows"]


def _write_jsonl(path, objects, *, blank_lines=False):
  with open(path, "w", encoding="utf-8") as f:
    for obj in objects:
      f.write(json.dumps(obj) + "\n")
      if blank_lines:
        f.write("\n")


def _write_array_record(path, payloads):
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  for payload in payloads:
    writer.write(payload)
  writer.close()


class SourcesTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path

  def _path(self, name):
    return os.path.join(self.dir, name)

  def test_text_units(self):
    path = self._path("play.txt")
    content = "Ber.\nWho's there?\n\n  \nFran.\nNay, answer me.\n\nBer.\n"
    with open(path, "w", encoding="utf-8") as f:
      f.write(content)
    by_file = sources.make_file_source("text", path, text_field="",
                                       text_unit="file")
    self.assertEqual([by_file[0]], [content.encode()])
    paragraphs = sources.make_file_source("text", path, text_field="",
                                          text_unit="paragraph")
    self.assertEqual([paragraphs[i] for i in range(len(paragraphs))],
                     [b"Ber.\nWho's there?", b"Fran.\nNay, answer me.",
                      b"Ber."])
    self.assertEqual([paragraphs.where(i) for i in range(3)],
                     [f"{path}:1", f"{path}:5", f"{path}:8"])
    lines = sources.make_file_source("text", path, text_field="",
                                     text_unit="line")
    self.assertEqual([lines[i] for i in range(len(lines))],
                     [b"Ber.", b"Who's there?", b"Fran.", b"Nay, answer me.",
                      b"Ber."])
    self.assertEqual(lines.where(3), f"{path}:6")
    self.assertEqual(lines.size(1), len("Who's there?"))
    self.assertEqual(lines.payload, "text")

  @parameterized.parameters("line", "paragraph")
  def test_files_are_indexed_a_chunk_at_a_time_as_if_whole(self, unit):
    # What a whole-file reading gives: records of non-blank lines or runs of
    # them, with their byte ranges and first line numbers.
    def reference(content):
      lines, offset = [], 0
      for number, line in enumerate(content.split(b"\n"), 1):
        lines.append((offset, offset + len(line), number, not line.strip()))
        offset += len(line) + 1
      if content.endswith(b"\n") or not content:
        lines.pop()
      if unit == "line":
        return [(s, e, n) for s, e, n, blank in lines if not blank]
      records = []
      for s, e, n, blank in lines:
        if blank:
          previous_blank = True
          continue
        if records and not previous_blank:
          records[-1] = (records[-1][0], e, records[-1][2])
        else:
          records.append((s, e, n))
        previous_blank = False
      return records

    contents = [b"", b"\n", b"one", b"one\n", b"\n\n a\n\n", b" \t\r\n",
                b"Ber.\r\nWho's there?\r\n\r\n  \nFran.\nNay\n\nBer.",
                b"x" * 40 + b"\n" + b" " * 30 + b"\n\n" + b"y" * 25]
    for content in contents:
      path = self._path("f.txt")
      with open(path, "wb") as f:
        f.write(content)
      want = reference(content)
      for chunk_bytes in (1, 2, 3, 7, 64, 1 << 20):
        starts, ends, lines = sources._index_file(path, unit, chunk_bytes)
        self.assertEqual(list(zip(starts.tolist(), ends.tolist(),
                                  lines.tolist())), want,
                         (content, chunk_bytes))

  def test_jsonl_skips_blank_lines_and_numbers_lines(self):
    first, second = self._path("a.jsonl"), self._path("b.jsonl")
    _write_jsonl(first, [{"text": t} for t in _TEXTS[:3]], blank_lines=True)
    _write_jsonl(second, [{"text": t} for t in _TEXTS[3:]])
    source = sources.make_file_source("jsonl", os.path.join(self.dir, "*"),
                                      text_field="text", text_unit="line")
    self.assertLen(source, 5)
    self.assertEqual([json.loads(source[i])["text"] for i in range(5)],
                     _TEXTS)
    self.assertEqual(source.where(2), f"{first}:5")
    self.assertEqual(source.where(3), f"{second}:1")
    self.assertEqual(source.payload, "json")

  def test_parquet_rows_over_row_groups_and_files(self):
    first, second = self._path("a.parquet"), self._path("b.parquet")
    parquet.write_table(pyarrow.table({"text": _TEXTS[:3], "id": [0, 1, 2]}),
                        first, row_group_size=2)
    parquet.write_table(pyarrow.table({"text": _TEXTS[3:], "id": [3, 4]}),
                        second)
    source = sources.make_file_source(
        "parquet", f"{first},{second}", text_field="text", text_unit="line")
    self.assertLen(source, 5)
    # Out of order, so that row groups are evicted and read again.
    for i in (4, 0, 3, 2, 1, 0):
      self.assertEqual(source[i], _TEXTS[i])
    self.assertEqual(source.where(2), f"{first} row 2")
    self.assertEqual(source.where(4), f"{second} row 1")
    with self.assertRaisesRegex(ValueError, "no column 'body'.*'text', 'id'"):
      sources.make_file_source("parquet", first, text_field="body",
                               text_unit="line")

  def test_array_record(self):
    path = self._path("data.array_record")
    _write_array_record(path, [json.dumps({"text": t}).encode()
                               for t in _TEXTS])
    source = sources.make_file_source("arrayrecord", path, text_field="text",
                                      text_unit="line")
    self.assertLen(source, 5)
    self.assertEqual(json.loads(source[3])["text"], _TEXTS[3])
    self.assertEqual(source.where(3), f"{path} record 3")

  def test_arrow_saved_dataset(self):
    path = self._path("saved")
    datasets.Dataset.from_dict({"text": _TEXTS}).save_to_disk(path)
    source = sources.make_file_source("arrow", path, text_field="text",
                                      text_unit="line")
    self.assertEqual([source[i] for i in range(len(source))], _TEXTS)
    self.assertEqual(source.where(1), f"{path} row 1")
    with self.assertRaisesRegex(ValueError, "no column 'body'"):
      sources.make_file_source("arrow", path, text_field="body",
                               text_unit="line")

  def test_arrow_dataset_dict_names_its_splits(self):
    path = self._path("dict")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"text": _TEXTS})}).save_to_disk(path)
    with self.assertRaisesRegex(ValueError, "DatasetDict.*dict/train"):
      sources.make_file_source("arrow", path, text_field="text",
                               text_unit="line")

  def test_pattern_errors(self):
    with self.assertRaisesRegex(FileNotFoundError, "nothing_here"):
      sources.expand_patterns(self._path("nothing_here*.txt"))
    with self.assertRaisesRegex(ValueError, "config.data.files"):
      sources.expand_patterns(" , ")
    with self.assertRaisesRegex(ValueError, "text_unit='word'"):
      sources.make_file_source("text", self.dir, text_field="",
                               text_unit="word")

  def test_comma_separated_patterns_are_sorted_and_deduplicated(self):
    for name in ("b.txt", "a.txt"):
      with open(self._path(name), "w") as f:
        f.write("x")
    paths = sources.expand_patterns(f"{self.dir}/b.txt, {self.dir}/*.txt")
    self.assertEqual([os.path.basename(p) for p in paths], ["a.txt", "b.txt"])


if __name__ == "__main__":
  absltest.main()
