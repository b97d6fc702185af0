#!/usr/bin/env bash
# Runs a test under Bazel's --run_under (.bazelrc) and ends its log with the
# largest resident memory any of its processes reached, for
# tools/bench/test_times.py. A process's peak, not the sum over processes: a
# test that starts two processes at once reports the larger one.
exec python3 -S -c '
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"peak resident memory: {kib} KiB", file=sys.stderr)
sys.exit(code if code >= 0 else 128 - code)
' "$@"
