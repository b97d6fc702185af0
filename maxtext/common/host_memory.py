"""Host memory: a malloc that keeps what XLA frees for the next step.

XLA's CPU runtime mallocs a program's buffers (its temporaries: activations,
logits, gradients) each time the program runs and frees them when it ends.
glibc's malloc serves large blocks with mmap and unmaps them on free, trims
its heaps and unmaps the emptied heaps of per-thread arenas, so every train
step page-faults all of its temporaries afresh, and the kernel zeroes each
page again. For issue #14's `small` shape on 1 CPU device that was 565,000
minor faults and 0.97 s of system time per step, 15 % of its CPU time.

`keep_freed_memory()` makes the process keep freed memory for reuse, one of
two ways:

* mimalloc (the binaries' way). The process runs under mimalloc
  (`LD_PRELOAD`) with purging off (`MIMALLOC_PURGE_DELAY=-1`): it never
  returns freed memory to the system. With `reexec=True` (a binary's main
  module) and mimalloc not yet loaded, the call re-executes the process
  under it (`os.execve`: the same process id, arguments and environment),
  so it must run before anything else happens in the process. The library
  is `$MAXTEXT_MIMALLOC`, else the bundled `cmeel-mimalloc`'s
  (`maxtext.common.bundled`: the Bazel runfile of `@mimalloc`, a dependency
  of this library; the pip install downloads it once).
* glibc's malloc, tuned (elsewhere: `reexec=False`, no library found,
  $LD_PRELOAD set by the user, or $MAXTEXT_KEEP_FREED_MEMORY=glibc). Large
  blocks come from the heap (M_MMAP_MAX 0), the heap is never trimmed
  (M_TRIM_THRESHOLD), and all threads share the main arena (M_ARENA_MAX 1):
  a per-thread arena serves a block larger than its 64 MiB heaps with mmap
  whatever M_MMAP_MAX says, and unmaps its heaps that empty. Per-thread
  arenas are created when a thread first allocates, and the arena limit is
  read then, so this too must run before any thread starts (importing numpy
  starts OpenBLAS's).

Both hold the process at its peak after the first steps; it faults no more
(unless the kernel reclaims idle pages itself, as DAMON's `pageout` does on
some VMs: fewer faults there, not none). Memory freed by the process is not
returned to the system until it exits, so its resident size stays at its
peak. The single arena makes glibc's way compile 10-50 % slower (its
threads contend for one lock); mimalloc has per-thread heaps, and on issue
#14's shapes it compiled 25-40 % faster than the tuned glibc, stepped 2-6 %
faster and peaked lower (`tools/bench/README.md`).

$MAXTEXT_KEEP_FREED_MEMORY=0 leaves glibc's malloc as it is.
"""

import ctypes
import os
import sys

from maxtext.common import bundled

# glibc's <malloc.h> mallopt parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
ENV_VAR = "MAXTEXT_KEEP_FREED_MEMORY"
_SETTINGS = ("0", "1", "glibc")
LIBRARY_ENV_VAR = "MAXTEXT_MIMALLOC"
# Set in the environment of the re-executed process: it does not try again.
_REEXEC_ENV_VAR = "MAXTEXT_MIMALLOC_REEXEC"
# mimalloc's options of the re-executed process, unless already set.
MIMALLOC_OPTIONS = {"MIMALLOC_PURGE_DELAY": "-1"}


def keep_freed_memory(*, reexec: bool = False) -> str:
  """Makes the process keep freed memory (module docstring).

  Args:
    reexec: Re-execute the process under mimalloc when it is not loaded
      yet; only a program's main module, first thing, passes True.

  Returns:
    "mimalloc" or "glibc", whichever keeps freed memory, or "" where
    neither does: $MAXTEXT_KEEP_FREED_MEMORY=0, or another C library than
    glibc (another OS) without mimalloc.

  Raises:
    ValueError: $MAXTEXT_KEEP_FREED_MEMORY is set to other than 0, 1 or
      glibc, or $MAXTEXT_MIMALLOC is not a file.
  """
  setting = os.environ.get(ENV_VAR, "1")
  if setting not in _SETTINGS:
    raise ValueError(f"${ENV_VAR} is {setting!r}; valid: '0' (off), '1' (on,"
                     " the default: mimalloc where found) or 'glibc'"
                     " (glibc's malloc, tuned).")
  # Not passed on to the process's children.
  reexecuted = os.environ.pop(_REEXEC_ENV_VAR, None) is not None
  if setting == "0":
    return ""
  if mimalloc_loaded():
    return "mimalloc"
  if (setting == "1" and reexec and not reexecuted
      and not os.environ.get("LD_PRELOAD")
      and sys.argv and sys.argv[0] not in ("", "-")):
    library = _find_mimalloc()
    if library is not None:
      _reexec_under(library)
  return "glibc" if _tune_glibc() else ""


def malloc_name(kept: str) -> str:
  """The host malloc that `keep_freed_memory()`'s result `kept` leaves, as
  logs name it: "mimalloc", "glibc" or "glibc's default"."""
  return kept or "glibc's default"


def mimalloc_loaded() -> bool:
  """Whether mimalloc is this process's malloc."""
  process = ctypes.CDLL(None)
  if not hasattr(process, "mi_is_in_heap_region"):
    return False
  process.malloc.restype = ctypes.c_void_p
  process.malloc.argtypes = [ctypes.c_size_t]
  process.free.argtypes = [ctypes.c_void_p]
  process.mi_is_in_heap_region.argtypes = [ctypes.c_void_p]
  pointer = process.malloc(64)
  try:
    return bool(process.mi_is_in_heap_region(pointer))
  finally:
    process.free(pointer)


def _find_mimalloc() -> str | None:
  """Path of mimalloc's shared library (module docstring), or None."""
  library = os.environ.get(LIBRARY_ENV_VAR)
  if library:
    if not os.path.isfile(library):
      raise ValueError(f"${LIBRARY_ENV_VAR} is {library!r}, which is not a"
                       " file; valid: the path of libmimalloc.so, or unset.")
    return library
  try:
    return bundled.path("mimalloc")
  except bundled.AssetError:  # glibc's malloc, tuned, instead.
    return None


def _reexec_under(library: str) -> None:
  """Replaces this process with itself under `library` (never returns)."""
  env = dict(os.environ, LD_PRELOAD=library, **{_REEXEC_ENV_VAR: "1"})
  for name, value in MIMALLOC_OPTIONS.items():
    env.setdefault(name, value)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, env)


def _tune_glibc() -> bool:
  """glibc's malloc keeps freed memory (module docstring); False without
  glibc."""
  # The C library the interpreter is linked with.
  mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
  if mallopt is None:
    return False  # Not glibc (macOS's has no mallopt).
  # mallopt takes an int; -1 is the largest size_t, so never trim.
  return all(mallopt(param, value) == 1
             for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
                                  (_M_TRIM_THRESHOLD, -1)))
