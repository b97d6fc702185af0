r"""Where a `bazel test` run's time and memory went, per target.

Reads the run's build event file (`--build_event_json_file`) for each test
target's time and whether its result came from a cache, and the `test.log`
of each of its shards for its peak resident memory (the line
tools/bench/peak_rss.sh, .bazelrc's --run_under, ends it with), the JAX
compilations it ran (their count, seconds and the slowest programs; the
logs have them when the run set `JAX_LOG_COMPILES=1`) and the programs it
loaded from JAX's persistent compilation cache. Prints the targets slowest
first, and warns about any target not tagged manual that took longer than
--warn_s or whose largest process held more than --warn_gib resident (a
warning, not a failure: these machines are noisy). Standard library only,
so `.ci/run` runs it with the host's python3.

  tools/bazel test //... --build_event_json_file=/tmp/bep.json \
      --test_env=JAX_LOG_COMPILES=1
  python3 tools/bench/test_times.py --bep=/tmp/bep.json

Columns: seconds (the slowest shard's; "+" marks a sharded target, whose
shards' sum is in "cpu s"), the peak resident memory of the target's
largest process in GiB (over its shards; "-" where the log has no such
line: a result from a cache whose log predates it), where the result came
from (run, cached locally or from the disk cache), the XLA compilations and their seconds,
persistent-cache hits, and the programs that took the longest to compile.
"""

import argparse
import collections
import dataclasses
import json
import os
import re
import sys

_COMPILE = re.compile(
    r"Finished XLA compilation of (.+?) in ([0-9.]+) sec")
_CACHE_HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")
_PEAK_RSS = re.compile(r"^peak resident memory: ([0-9]+) KiB$")


@dataclasses.dataclass
class Target:
  """One test target's shards and runs, as the build events report them."""

  label: str
  seconds: list[float] = dataclasses.field(default_factory=list)
  source: str = "run"
  compiles: int = 0
  compile_s: float = 0.0
  cache_hits: int = 0
  peak_kib: int | None = None
  programs: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  logs: list[str] = dataclasses.field(default_factory=list)

  @property
  def wall_s(self) -> float:
    return max(self.seconds, default=0.0)

  @property
  def cpu_s(self) -> float:
    return sum(self.seconds)

  @property
  def peak_gib(self) -> float | None:
    return None if self.peak_kib is None else self.peak_kib / 2**20


def read_build_events(path: str) -> tuple[dict[str, Target], set[str]]:
  """The test targets of a build event file, and the labels tagged manual
  (from the targets' configured events)."""
  targets: dict[str, Target] = {}
  manual: set[str] = set()
  with open(path, encoding="utf-8") as f:
    for line in f:
      event = json.loads(line)
      ident = event.get("id", {})
      if "targetConfigured" in ident:
        if "manual" in event.get("configured", {}).get("tag", []):
          manual.add(ident["targetConfigured"]["label"])
      if "testResult" not in ident:
        continue
      label = ident["testResult"]["label"]
      result = event.get("testResult", {})
      target = targets.setdefault(label, Target(label))
      target.seconds.append(
          int(result.get("testAttemptDurationMillis", 0)) / 1000)
      target.logs.extend(
          output["uri"].removeprefix("file://")
          for output in result.get("testActionOutput", [])
          if output.get("name") == "test.log")
      if result.get("cachedLocally"):
        target.source = "cached"
      elif result.get("executionInfo", {}).get("cachedRemotely"):
        target.source = "disk cache"
  return targets, manual


def read_logs(target: Target) -> None:
  """Adds the peak memory, compilations and cache hits in the target's test
  logs."""
  for path in target.logs:
    if not os.path.isfile(path):
      continue
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        match = _COMPILE.search(line)
        if match:
          seconds = float(match.group(2))
          target.compiles += 1
          target.compile_s += seconds
          target.programs[match.group(1)] += seconds
        elif _CACHE_HIT.search(line):
          target.cache_hits += 1
        else:
          match = _PEAK_RSS.match(line)
          if match:
            target.peak_kib = max(target.peak_kib or 0, int(match.group(1)))


def table(targets: list[Target], top: int) -> str:
  rows = [f"{'seconds':>8} {'cpu s':>7} {'GiB':>5} {'result':<10}"
          f" {'compiles':>8}"
          f" {'compile s':>9} {'cache hits':>10}  target: slowest programs"]
  for t in targets[:top]:
    programs = ", ".join(
        f"{name} {seconds:.1f}s" for name, seconds in
        t.programs.most_common(3))
    sharded = "+" if len(t.seconds) > 1 else " "
    gib = "-" if t.peak_gib is None else f"{t.peak_gib:.2f}"
    rows.append(
        f"{t.wall_s:>7.1f}{sharded} {t.cpu_s:>7.1f} {gib:>5} {t.source:<10}"
        f" {t.compiles:>8} {t.compile_s:>9.1f} {t.cache_hits:>10}"
        f"  {t.label}{': ' + programs if programs else ''}")
  return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--bep", required=True,
                      help="The run's --build_event_json_file.")
  parser.add_argument("--top", type=int, default=10,
                      help="Targets listed (0: all).")
  parser.add_argument("--warn_s", type=float, default=120.0,
                      help="Warn about non-manual targets slower than this.")
  parser.add_argument("--warn_gib", type=float, default=4.0,
                      help="Warn about non-manual targets whose largest"
                      " process held more resident memory than this.")
  args = parser.parse_args(argv)
  try:
    targets, manual = read_build_events(args.bep)
  except (OSError, ValueError) as e:
    print(f"test_times: error: cannot read {args.bep}: {e}", file=sys.stderr)
    return 1
  for target in targets.values():
    read_logs(target)
  ordered = sorted(targets.values(), key=lambda t: -t.wall_s)
  run = [t for t in ordered if t.source == "run"]
  print(f"{len(ordered)} test targets: {len(run)} run"
        f" ({sum(t.cpu_s for t in run):.0f} s of test time,"
        f" {sum(t.compile_s for t in run):.0f} s of it XLA compilation),"
        f" {len(ordered) - len(run)} from a cache.")
  measured = [t for t in run if t.peak_gib is not None]
  if measured:
    largest = max(measured, key=lambda t: t.peak_gib)
    print(f"Largest resident memory of a run target: {largest.peak_gib:.2f}"
          f" GiB, {largest.label}.")
  print(table(ordered, args.top or len(ordered)))
  for t in ordered:
    if t.source != "run" or t.label in manual:
      continue
    if t.wall_s > args.warn_s:
      print(f"WARNING: {t.label} took {t.wall_s:.0f} s, over the"
            f" {args.warn_s:.0f} s budget of a non-manual test target.")
    if t.peak_gib is not None and t.peak_gib > args.warn_gib:
      print(f"WARNING: {t.label} held {t.peak_gib:.1f} GiB resident, over"
            f" the {args.warn_gib:g} GiB budget of a non-manual test target.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
