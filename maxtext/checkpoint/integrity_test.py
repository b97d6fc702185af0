"""Tests for maxtext.checkpoint.integrity."""

import hashlib
import json
import os
from unittest import mock

from absl.testing import absltest

from maxtext.checkpoint import integrity


class ManifestTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    self.files = {"a.bin": os.urandom(5000), "sub/b.json": b'{"x": 1}',
                  "sub/deeper/c": b"", "_CHECKPOINT_METADATA": b"{}"}
    for name, data in self.files.items():
      os.makedirs(os.path.dirname(os.path.join(self.dir, name)),
                  exist_ok=True)
      with open(os.path.join(self.dir, name), "wb") as f:
        f.write(data)
    integrity.write_manifest(self.dir)

  def _path(self, name):
    return os.path.join(self.dir, name)

  def test_manifest_records_size_and_sha256_of_every_file(self):
    with open(self._path(integrity.MANIFEST_FILENAME)) as f:
      files = json.load(f)["files"]
    checked = {n: d for n, d in self.files.items()
               if n not in integrity.UNCHECKED_FILES}
    self.assertEqual(sorted(files), sorted(checked))
    for name, data in checked.items():
      self.assertEqual(files[name], {"size": len(data),
                                     "sha256": hashlib.sha256(data)
                                     .hexdigest()})
    self.assertEqual(integrity.check(self.dir), [])

  def test_flipped_byte_is_found(self):
    with open(self._path("a.bin"), "r+b") as f:
      f.seek(1234)
      byte = f.read(1)
      f.seek(1234)
      f.write(bytes([byte[0] ^ 0x10]))
    self.assertEqual(integrity.check(self.dir),
                     ["a.bin: SHA-256 differs from the manifest (bytes"
                      " altered)"])

  def test_truncated_and_missing_files_are_found(self):
    with open(self._path("a.bin"), "r+b") as f:
      f.truncate(4096)  # A partial write.
    os.remove(self._path("sub/b.json"))
    self.assertEqual(integrity.check(self.dir), [
        "a.bin: 4096 bytes, the manifest says 5000 (truncated or"
        " overwritten)",
        "sub/b.json: missing"])

  def test_missing_or_broken_manifest_is_a_problem(self):
    manifest = self._path(integrity.MANIFEST_FILENAME)
    with open(manifest, "w") as f:
      f.write('{"version": 1, "files": {"a.bin": ')  # Cut short.
    [problem] = integrity.check(self.dir)
    self.assertIn("is not valid JSON", problem)
    with open(manifest, "w") as f:
      json.dump({"version": 1, "files": {}}, f)
    self.assertEqual(integrity.check(self.dir),
                     [f"{integrity.MANIFEST_FILENAME} is not a version-1"
                      " manifest"])
    os.remove(manifest)
    self.assertEqual(integrity.check(self.dir),
                     [f"{integrity.MANIFEST_FILENAME} is missing"])

  def test_manifest_that_cannot_be_read_or_points_outside_is_a_problem(self):
    manifest = self._path(integrity.MANIFEST_FILENAME)
    os.remove(manifest)
    os.mkdir(manifest)
    [problem] = integrity.check(self.dir)
    self.assertIn(f"{integrity.MANIFEST_FILENAME} cannot be read", problem)
    os.rmdir(manifest)
    for name in ("../outside.bin", "/etc/hostname", "sub/../../x"):
      with open(manifest, "w") as f:
        json.dump({"version": 1, "files": {name: {"size": 1, "sha256": ""}}},
                  f)
      self.assertEqual(integrity.check(self.dir), [
          f"{integrity.MANIFEST_FILENAME} names files outside its folder:"
          f" [{name!r}]"])

  def test_files_that_are_not_files_or_cannot_be_read_are_problems(self):
    os.remove(self._path("a.bin"))
    os.symlink("/dev/zero", self._path("a.bin"))  # Somewhere surprising.
    os.remove(self._path("sub/b.json"))
    os.symlink(self._path("nowhere"), self._path("sub/b.json"))
    real_sha256 = integrity._sha256

    def sha256(path):
      if path.endswith("deeper/c"):
        raise PermissionError(13, "Permission denied", path)
      return real_sha256(path)

    with mock.patch.object(integrity, "_sha256", sha256):
      self.assertEqual(integrity.check(self.dir), [
          "a.bin: not a regular file", "sub/b.json: not a regular file",
          "sub/deeper/c: cannot be read (Permission denied)"])

  def test_problems_in_one_line(self):
    problems = [f"f{i}: missing" for i in range(7)]
    self.assertEqual(integrity.summary(problems),
                     "f0: missing; f1: missing; f2: missing; f3: missing;"
                     " f4: missing (and 2 more)")
    self.assertEqual(integrity.summary(problems[:1]), "f0: missing")

  def test_shards_split_the_files_between_processes(self):
    os.remove(self._path("sub/deeper/c"))
    found = [integrity.check(self.dir, shard_index=i, shard_count=2)
             for i in range(2)]
    self.assertEqual(sorted(found[0] + found[1]), ["sub/deeper/c: missing"])
    self.assertIn([], found)  # The other shard does not check that file.

  def test_files_added_later_and_orbax_metadata_are_not_checked(self):
    with open(self._path("extra.txt"), "w") as f:
      f.write("added after the save")
    with open(self._path("_CHECKPOINT_METADATA"), "w") as f:
      f.write('{"commit_timestamp_nsecs": 1}')  # Orbax rewrites it.
    self.assertEqual(integrity.check(self.dir), [])


if __name__ == "__main__":
  absltest.main()
