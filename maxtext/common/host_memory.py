"""Host memory: let malloc keep what XLA frees for the next step.

XLA's CPU runtime mallocs a program's buffers (its temporaries: activations,
logits, gradients) each time the program runs and frees them when it ends.
glibc's malloc serves large blocks with mmap and unmaps them on free, trims
its heaps and unmaps the emptied heaps of per-thread arenas, so every train
step page-faults all of its temporaries afresh, and the kernel zeroes each
page again. For issue #14's `small` shape on 1 CPU device that was 565,000
minor faults and 0.97 s of system time per step, 15 % of its CPU time.

`keep_freed_memory()` makes glibc's malloc keep freed memory for reuse:
large blocks come from the heap (M_MMAP_MAX 0), the heap is never trimmed
(M_TRIM_THRESHOLD), and all threads share the main arena (M_ARENA_MAX 1): a
per-thread arena serves a block larger than its 64 MiB heaps with mmap
whatever M_MMAP_MAX says, and unmaps its heaps that empty. After the first
steps the process holds its peak and faults no more (unless the kernel
reclaims idle pages itself, as DAMON's `pageout` does on some VMs: fewer
faults there, not none). The cost: memory freed by the process is not
returned to the system until it exits, so its resident size stays at its
peak; and compiling gets slower (measured +10-50 % on issue #14's shapes;
the single arena alone costs it, where inside XLA was not found), a one-time
cost that the persistent compilation cache avoids on reruns. Steps got
10-25 % faster on those shapes (`tools/bench/README.md`).

Per-thread arenas are created when a thread first allocates, and the arena
limit is read then, so this must run before any thread starts (importing
numpy starts OpenBLAS's). The binaries that run steps call it before their
other imports. Setting $MAXTEXT_KEEP_FREED_MEMORY=0 turns it off.
"""

import ctypes
import os

# glibc's <malloc.h> mallopt parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
ENV_VAR = "MAXTEXT_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
  """Sets glibc's malloc to keep freed memory (module docstring); returns
  whether it did: False with $MAXTEXT_KEEP_FREED_MEMORY=0 or without glibc
  (another C library, another OS).

  Raises:
    ValueError: $MAXTEXT_KEEP_FREED_MEMORY is set to other than 0 or 1.
  """
  setting = os.environ.get(ENV_VAR, "1")
  if setting not in ("0", "1"):
    raise ValueError(f"${ENV_VAR} is {setting!r}; valid: '0' (off) or '1'"
                     " (on, the default).")
  if setting == "0":
    return False
  # The C library the interpreter is linked with.
  mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
  if mallopt is None:
    return False  # Not glibc (macOS's has no mallopt).
  # mallopt takes an int; -1 is the largest size_t, so never trim.
  return all(mallopt(param, value) == 1
             for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
                                  (_M_TRIM_THRESHOLD, -1)))
