"""Tests tools/bench/test_times on build events shaped as Bazel 4.2.3 writes
them (`--build_event_json_file`) and test logs with JAX's compile lines."""

import contextlib
import io
import json

from absl.testing import absltest

from tools.bench import test_times


def _result(label, millis, log, *, shard=1, local=False, remote=False):
  execution = {"strategy": "linux-sandbox"}
  if remote:
    execution["cachedRemotely"] = True
  result = {"testActionOutput": [{"name": "test.log", "uri": f"file://{log}"},
                                 {"name": "test.xml", "uri": "file:///x"}],
            "testAttemptDurationMillis": str(millis), "status": "PASSED",
            "executionInfo": execution}
  if local:
    result["cachedLocally"] = True
  return {"id": {"testResult": {"label": label, "run": 1, "shard": shard,
                                "attempt": 1}}, "testResult": result}


class TestTimesTest(absltest.TestCase):

  def test_targets_slowest_first_with_compiles_and_warnings(self):
    folder = self.create_tempdir()
    slow_log = folder.create_file("slow.log", content=(
        "WARNING ... Finished tracing jit(f) for jit in 0.1 sec\n"
        "WARNING ... Finished XLA compilation of jit(train_step) in"
        " 12.500000000 sec\n"
        "WARNING ... Finished XLA compilation of jit(init) in 0.5 sec\n"
        "WARNING ... Persistent compilation cache hit for 'jit_eval'"
        " with key 'k'\n"
        "peak resident memory: 1572864 KiB\n")).full_path
    # The larger shard's peak is the target's; 5 GiB is over the budget.
    shard_logs = [folder.create_file(f"s{i}.log", content=(
        "Finished XLA compilation of jit(f) in 1.0 sec\n"
        f"peak resident memory: {kib} KiB\n")).full_path
                  for i, kib in ((1, 5 * 2**20), (2, 2**20))]
    events = [
        {"id": {"targetConfigured": {"label": "//a:slow"}},
         "configured": {"targetKind": "py_test rule", "tag": []}},
        _result("//a:slow", 130_000, slow_log),
        _result("//a:sharded", 40_000, shard_logs[0], shard=1),
        _result("//a:sharded", 50_000, shard_logs[1], shard=2),
        _result("//a:local", 200_000, "/missing.log", local=True),
        _result("//a:disk", 1_000, "/missing.log", remote=True),
    ]
    bep = folder.create_file("bep.json", content="".join(
        json.dumps(e) + "\n" for e in events)).full_path
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      self.assertEqual(test_times.main([f"--bep={bep}", "--top=3"]), 0)
    lines = out.getvalue().splitlines()
    self.assertEqual(
        lines[0], "4 test targets: 2 run (220 s of test time, 15 s of it XLA"
        " compilation), 2 from a cache.")
    self.assertEqual(lines[1], "Largest resident memory of a run target:"
                     " 5.00 GiB, //a:sharded.")
    # Slowest first; only three rows; a sharded target's wall is its
    # slowest shard, its cpu seconds the sum.
    rows = lines[3:6]
    self.assertEqual(
        [next(w for w in row.split() if w.startswith("//")).rstrip(":")
         for row in rows], ["//a:local", "//a:slow", "//a:sharded"])
    self.assertFalse(lines[6].startswith(" "))  # --top=3: no fourth row.
    slow = lines[4].split()
    self.assertEqual(slow[:7],
                     ["130.0", "130.0", "1.50", "run", "2", "13.0", "1"])
    self.assertIn("jit(train_step) 12.5s, jit(init) 0.5s", lines[4])
    self.assertTrue(lines[5].startswith("   50.0+    90.0  5.00 run"),
                    lines[5])
    # A cached result whose log is gone has no memory figure.
    self.assertEqual(lines[3].split()[2:4], ["-", "cached"])
    # Only the run targets over a budget are warned about, not the cached.
    warnings = [line for line in lines if line.startswith("WARNING")]
    self.assertEqual(warnings, [
        "WARNING: //a:slow took 130 s, over the 120 s budget of a"
        " non-manual test target.",
        "WARNING: //a:sharded held 5.0 GiB resident, over the 4 GiB budget"
        " of a non-manual test target."])

  def test_a_missing_build_event_file_is_one_line(self):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
      self.assertEqual(test_times.main(["--bep=/no/such.json"]), 1)
    self.assertStartsWith(err.getvalue(), "test_times: error: cannot read")
    self.assertEqual(err.getvalue().count("\n"), 1)


if __name__ == "__main__":
  absltest.main()
