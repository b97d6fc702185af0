"""Peak memory (RSS) of indexing a large JSONL file, streamed vs. whole.

Writes a JSONL file of `--gb` GB (lines of about 1 KB, some blank), then
indexes it in a fresh process with the data pipeline's own code
(`sources.make_file_source`, which reads `_INDEX_CHUNK_BYTES` at a time) and
prints its peak RSS minus that of a process that indexes a one-line file
(imports and fixed costs).
For comparison, the same indexing done on the whole file at once (one chunk
of the file's size, as the index worked before it streamed) runs on a file
of `--whole_gb` GB: its peak grows with the file, by several times its size.

  tools/bazel run //tools/bench:index_memory -- [--gb=2] [--whole_gb=0.25]
"""

import json
import os
import tempfile

from absl import app
from absl import flags

from tools.bench import memory

_GB = flags.DEFINE_float("gb", 2.0, "Size of the file indexed in chunks.")
_WHOLE_GB = flags.DEFINE_float(
    "whole_gb", 0.25, "Size of the file indexed whole (its peak is several"
    " times this: keep it well under the machine's memory).")
_DIR = flags.DEFINE_string("dir", None, "Where to write the files (default: a"
                           " temporary folder, deleted after).")



def _write_jsonl(path: str, gigabytes: float) -> int:
  """Writes about `gigabytes` of JSONL lines; returns the number of records."""
  block_lines = [json.dumps({"text": f"record {i} " + "lorem ipsum " * 80})
                 for i in range(1000)]
  block = ("\n".join(block_lines) + "\n\n").encode()  # One blank line too.
  blocks = max(1, int(gigabytes * 1e9 / len(block)))
  with open(path, "wb") as f:
    for _ in range(blocks):
      f.write(block)
  return blocks * len(block_lines)


def _index(path: str, chunk: str) -> tuple[float, float, int]:
  """(peak RSS MB, seconds, records) of indexing `path` in a fresh process,
  with `chunk` (a Python expression) bytes per read."""
  code = f"""
import time
from maxtext.data import sources
sources._INDEX_CHUNK_BYTES = {chunk}
start = time.perf_counter()
source = sources.make_file_source("jsonl", {path!r}, text_field="text",
                                  text_unit="line")
print(time.perf_counter() - start, len(source))
"""
  peak, printed = memory.run_measured(code)
  seconds, records = printed.split()[-2:]
  return peak, float(seconds), int(records)


def main(argv: list[str]) -> None:
  del argv
  with tempfile.TemporaryDirectory(dir=_DIR.value) as folder:
    tiny = os.path.join(folder, "tiny.jsonl")
    with open(tiny, "w", encoding="utf-8") as f:
      f.write('{"text": "one record"}\n')
    base, _, _ = _index(tiny, "sources._INDEX_CHUNK_BYTES")
    print(f"a one-line file: peak RSS {base:.0f} MB")
    for name, gigabytes in (("streamed", _GB.value),
                            ("whole file", _WHOLE_GB.value)):
      path = os.path.join(folder, f"{name.replace(' ', '_')}.jsonl")
      written = _write_jsonl(path, gigabytes)
      size_mb = os.path.getsize(path) / 1e6
      peak, seconds, records = _index(
          path, str(os.path.getsize(path)) if name == "whole file" else
          "sources._INDEX_CHUNK_BYTES")
      if records != written:
        raise RuntimeError(f"indexed {records} records of {written}")
      print(f"{name}: {size_mb:.0f} MB file, {records} records, indexed in"
            f" {seconds:.1f} s, peak RSS {peak - base:.0f} MB over the"
            f" one-line file's ({(peak - base) / size_mb:.3f} MB per MB of file)")
      os.remove(path)


if __name__ == "__main__":
  app.run(main)
