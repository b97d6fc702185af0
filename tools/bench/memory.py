"""Memory figures the benchmarks share."""

import resource

import jax


def peak_memory() -> str:
  """Device 0's peak bytes where the backend counts them, else the host
  process's peak RSS."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return f"{stats['peak_bytes_in_use'] / 2**30:.2f} GiB (device 0)"
  rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return f"{rss_kib / 2**20:.2f} GiB (host peak RSS)"
