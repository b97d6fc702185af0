r"""Runs the chip suites and writes what they found under --out.

  python3 -m tools.tpu.harness --suites=kernels,models --out=$OUT

Each suite runs in a process of its own, one after another (one process at
a time can hold a TPU), bounded by --timeout_s; a suite that hangs or
aborts is reported and the next one runs. Under --out: `<suite>.json` (the
suite's results), `summary.json` (each suite's status, seconds and counts,
the devices and the library versions) and the suites' printed lines in
`log.txt`. Exits 1 when any check failed or a suite did not finish.

Suites:
  kernels  tools/tpu/kernel_checks.py: each kernel against its CPU
           reference, forward and gradients, float32 and bfloat16.
  models   tools/tpu/model_checks.py: every family's tiny model's logits
           against the CPU's, and an MoE model's gradients through the
           chip's grouped matmul against the dense experts'.
  binaries tools/tpu/binary_checks.py: `train` on the default config
           (synthetic tokens and the bundled text) resumes exactly, and
           `decode`'s greedy tokens (dense and paged cache) equal the
           CPU's.

`--small` runs the shapes a CPU runs in seconds: CI runs the suites so on
the CPU (tools/tpu:harness_test), so the harness cannot rot without a chip.
"""

import argparse
import json
import os
import subprocess
import sys
import time

SUITES = ("kernels", "models", "binaries")


def _environment() -> dict:
  # pylint: disable-next=import-outside-toplevel
  import jax
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  versions = {}
  for name in ("jax", "jaxlib", "libtpu", "flax"):
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      versions[name] = None
  return {"backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()],
          "device_kind": jax.devices()[0].device_kind,
          "versions": versions,
          "tpu_environment": {k: v for k, v in os.environ.items()
                              if k.startswith("TPU_")}}


def run_suite(suite: str, small: bool, only: list[str]) -> dict:
  """Runs `suite` in this process; returns its results with the
  environment they ran in."""
  # pylint: disable=import-outside-toplevel
  if suite == "kernels":
    from tools.tpu import kernel_checks as checks
  elif suite == "models":
    from tools.tpu import model_checks as checks
  else:
    from tools.tpu import binary_checks as checks
  results = checks.run(small, only)
  return {"environment": _environment(), "results": results}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n", maxsplit=1)[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--suites", default=",".join(SUITES),
                      help=f"Comma-separated, of {', '.join(SUITES)}.")
  parser.add_argument("--out", required=True,
                      help="Folder for the JSON files and the log.")
  parser.add_argument("--small", action="store_true",
                      help="CPU-sized shapes.")
  parser.add_argument("--only", default="",
                      help="Comma-separated prefixes of check names to run.")
  parser.add_argument("--timeout_s", type=float, default=540.0,
                      help="Seconds each suite may take.")
  parser.add_argument("--run_suite", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  suites = [s for s in args.suites.split(",") if s]
  unknown = [s for s in suites if s not in SUITES]
  if unknown or not suites:
    parser.error(f"--suites={args.suites!r}: give one or more of"
                 f" {', '.join(SUITES)}, comma-separated.")
  if args.timeout_s <= 0:
    parser.error(f"--timeout_s={args.timeout_s:g} must be positive.")
  only = [p for p in args.only.split(",") if p]
  os.makedirs(args.out, exist_ok=True)
  if args.run_suite:
    report = run_suite(args.run_suite, args.small, only)
    with open(os.path.join(args.out, f"{args.run_suite}.json"), "w",
              encoding="utf-8") as f:
      json.dump(report, f, indent=1)
    return 0

  summary = {}
  with open(os.path.join(args.out, "log.txt"), "a", encoding="utf-8") as log:
    for suite in suites:
      start = time.monotonic()
      command = [sys.executable, "-m", "tools.tpu.harness",
                 f"--run_suite={suite}", f"--out={args.out}",
                 f"--only={args.only}"] + (["--small"] if args.small else [])
      log.write(f"== {suite}: {' '.join(command)}\n")
      log.flush()
      try:
        process = subprocess.run(command, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True,
                                 timeout=args.timeout_s, check=False)
        output, status = process.stdout, process.returncode
      except subprocess.TimeoutExpired as e:
        output = e.stdout if isinstance(e.stdout, str) else (
            (e.stdout or b"").decode(errors="replace"))
        status = "timeout"
      log.write(output)
      print(output, end="", flush=True)
      entry = {"status": status, "seconds": round(time.monotonic() - start, 1)}
      path = os.path.join(args.out, f"{suite}.json")
      if status == 0 and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
          report = json.load(f)
        results = report["results"]
        entry.update(
            environment=report["environment"], checks=len(results),
            failed=[" ".join(filter(None, (r["name"], r.get("dtype"))))
                    for r in results if not r["passed"]])
      summary[suite] = entry
      line = (f"== {suite}: {status} in {entry['seconds']} s"
              + (f", {entry['checks']} checks, {len(entry['failed'])} failed"
                 if "checks" in entry else ""))
      log.write(line + "\n")
      print(line, flush=True)
  with open(os.path.join(args.out, "summary.json"), "w",
            encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  ok = all(e["status"] == 0 and not e.get("failed") for e in summary.values())
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
