"""Tests of `rows.read_rows`: named fields of JSONL records, and the records
it refuses, each named by file and line."""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.posttrain import rows


class ReadRowsTest(parameterized.TestCase):

  def _write(self, *lines: str) -> str:
    path = os.path.join(self.create_tempdir().full_path, "rows.jsonl")
    with open(path, "w", encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in lines))
    return path

  def test_reads_the_fields_in_order(self):
    path = self._write(json.dumps({"prompt": "a", "completion": "b", "x": 1}),
                       json.dumps({"prompt": "c", "completion": "d"}))
    self.assertEqual(
        list(rows.read_rows("jsonl", path, ["prompt", "completion"])),
        [{"prompt": "a", "completion": "b"},
         {"prompt": "c", "completion": "d"}])

  @parameterized.named_parameters(
      ("not_json", '{"prompt": "a"', r"rows\.jsonl:2.* is not JSON"),
      ("nested_too_deeply", '{"prompt": ' + "[" * 50_000 + "]" * 50_000 + "}",
       r"rows\.jsonl:2.* is not JSON: nested too deeply\.$"),
      ("not_an_object", '["prompt"]', r"rows\.jsonl:2.* is not a JSON object"),
      ("missing_field", '{"prompt": "a"}',
       r"rows\.jsonl:2.* has no field\(s\) \['completion'\]"),
  )
  def test_a_bad_record_is_named(self, line, message):
    path = self._write(json.dumps({"prompt": "a", "completion": "b"}), line)
    with self.assertRaisesRegex(ValueError, message):
      list(rows.read_rows("jsonl", path, ["prompt", "completion"]))


if __name__ == "__main__":
  absltest.main()
