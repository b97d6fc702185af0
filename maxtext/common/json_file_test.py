"""Tests maxtext.common.json_file: every damage is named with the file."""

import os

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.common import json_file


class ReadObjectTest(parameterized.TestCase):

  def test_an_object_is_read(self):
    path = self.create_tempfile("a.json", content='{"a": [1, 2]}').full_path
    self.assertEqual(json_file.read_object(path), {"a": [1, 2]})

  @parameterized.named_parameters(
      ("empty", b"", "is not valid JSON"),
      ("truncated", b'{"a": [1, ', "is not valid JSON"),
      ("garbage", b"\xff\xfe\x00garbage", "is not UTF-8 text"),
      ("a list", b"[1, 2]", "holds a JSON list, not an object"),
      ("a number", b"3", "holds a JSON int, not an object"),
      ("too deep", b"[" * 100000 + b"]" * 100000, "is nested too deeply"),
      ("a long number", b'{"a": ' + b"9" * 5000 + b"}", "is not valid JSON"))
  def test_damaged_contents(self, content, problem):
    path = os.path.join(self.create_tempdir().full_path, "x.json")
    with open(path, "wb") as f:
      f.write(content)
    with self.assertRaisesRegex(json_file.JsonFileError,
                                f"^{path} {problem}"):
      json_file.read_object(path)

  def test_missing_folder_dangling_link_and_not_a_file(self):
    folder = self.create_tempdir().full_path
    cases = {os.path.join(folder, "none.json"): "does not exist",
             folder: "cannot be read: Is a directory",
             os.path.join(folder, "link.json"): "is a dangling link"}
    os.symlink(os.path.join(folder, "gone"), os.path.join(folder,
                                                          "link.json"))
    cases[os.path.join(folder, "device.json")] = "is not a regular file"
    os.symlink("/dev/zero", os.path.join(folder, "device.json"))
    cases[os.path.join(folder, "pipe.json")] = "is not a regular file"
    os.mkfifo(os.path.join(folder, "pipe.json"))  # Opening it would block.
    for path, problem in cases.items():
      with self.assertRaisesRegex(json_file.JsonFileError,
                                  f"^{path} {problem}"):
        json_file.read_object(path)


if __name__ == "__main__":
  absltest.main()
