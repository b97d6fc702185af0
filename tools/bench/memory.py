"""Memory figures the benchmarks share."""

import resource
import subprocess
import sys

import jax


def peak_memory() -> str:
  """Device 0's peak bytes where the backend counts them, else the host
  process's peak RSS."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return f"{stats['peak_bytes_in_use'] / 2**30:.2f} GiB (device 0)"
  rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return f"{rss_kib / 2**20:.2f} GiB (host peak RSS)"


def run_measured(code: str) -> tuple[float, str]:
  """(peak RSS in MB, what it printed) of a fresh Python process running
  `code`."""
  script = ("import resource\n" + code +
            "\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
  out = subprocess.run([sys.executable, "-c", script], check=True,
                       capture_output=True, text=True).stdout
  printed, _, peak_kib = out.rstrip("\n").rpartition("\n")
  return int(peak_kib) / 1024, printed


def peak_rss_mb(code: str) -> float:
  """Peak RSS (MB) of a fresh Python process running `code`."""
  return run_measured(code)[0]
