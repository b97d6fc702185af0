"""host_memory: freed blocks stay in malloc's heap, for XLA's temporaries too.

Each case runs a child process (the setting must precede its threads, and
mimalloc is loaded by re-executing it) that calls
`keep_freed_memory(reexec=True)` first, as a binary does, and then reads the
allocator's own accounting while XLA runs a program with a 256 MiB
temporary: mimalloc's statistics (bytes purged, that is returned to the
system) or glibc's `mallinfo2` (which blocks were mmapped, and so unmapped
again on free, and how many free bytes the heap keeps). Each has a control
in which the allocator does return memory: mimalloc with purging on, glibc
as it is by default. Page faults are the effect that matters
(tools/bench/README.md measures them), but their count depends on the
machine (these VMs' kernel reclaims idle pages on its own), while the
allocators' accounting does not.
"""

import json
import os
import re
import subprocess
import sys

from absl.testing import absltest

from maxtext.common import host_memory
from testing import train_process

_CHILD = """
import ctypes
import json
import os
import sys
import threading
import time
from maxtext.common import host_memory
allocator = host_memory.keep_freed_memory(reexec=True)
# Its own module imported, the test's child passes reexec=False.
out = {"allocator": allocator, "pid": os.getpid(), "argv": sys.argv[1:],
       "imported": host_memory.keep_freed_memory()}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
MIB = 2**20

if allocator == "mimalloc":
  libc.mi_stats_get_json.restype = ctypes.c_char_p
  libc.mi_stats_get_json.argtypes = [ctypes.c_size_t, ctypes.c_char_p]

  def purged():
    buffer = ctypes.create_string_buffer(2**20)
    return json.loads(libc.mi_stats_get_json(len(buffer), buffer))["purged"]
else:

  class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
        "fsmblks", "uordblks", "fordblks", "keepcost")]

  libc.mallinfo2.restype = MallInfo2

  def block(name, size):
    pointer = libc.malloc(size)
    out[name + "_mmapped"] = libc.mallinfo2().hblkhd >= size
    libc.free(pointer)
    out[name + "_free_kept"] = libc.mallinfo2().fordblks >= size

  # 64 MiB from this thread; 128 MiB, more than a thread arena's heap, from
  # another thread.
  block("main", 64 * MIB)
  thread = threading.Thread(target=block, args=("thread", 128 * MIB))
  thread.start()
  thread.join()

import jax
import jax.numpy as jnp
# (x @ w) is a [65536, 1024] float32 temporary: 256 MiB, above any mmap
# threshold and arena heap size of glibc's malloc.
step = jax.jit(lambda x, w: (x @ w) @ w.T)
x, w = jnp.ones((65536, 64)), jnp.ones((64, 1024)) / 1024
for _ in range(3):
  step(x, w).block_until_ready()
if allocator == "mimalloc":
  # mimalloc purges freed memory a delay after the free (10 ms by default,
  # arenas' ten times that): the pauses give it the time.
  before = purged()
  for _ in range(3):
    step(x, w).block_until_ready()
    time.sleep(0.3)
  out["xla_purged_mib"] = (purged() - before) // MIB
else:
  # XLA frees a run's temporaries after its outputs are ready, on its own
  # thread: wait until nothing of 256 MiB is in use (in the heap or
  # mmapped).
  deadline = time.monotonic() + 60
  while (info := libc.mallinfo2()).uordblks + info.hblkhd >= 256 * MIB:
    if time.monotonic() > deadline:
      raise TimeoutError(f"XLA's temporaries still in use: {info.uordblks}"
                         f" bytes in the heap, {info.hblkhd} mmapped")
    time.sleep(0.01)
  out["xla_free_kept"] = info.fordblks >= 256 * MIB
print(json.dumps(out))
"""
_GLIBC_KEPT = {"main_mmapped": False, "main_free_kept": True,
               "thread_mmapped": False, "thread_free_kept": True,
               "xla_free_kept": True}


def _child(setting: str, **env_vars: str) -> dict:
  env = train_process.child_env(1)
  env[host_memory.ENV_VAR] = setting
  env.update(env_vars)
  process = subprocess.Popen([sys.executable, "-c", _CHILD, "an argument"],
                             env=env, stdout=subprocess.PIPE, text=True)
  out, _ = process.communicate()
  if process.returncode:
    raise AssertionError(f"The child failed ({process.returncode}).")
  result = json.loads(out.splitlines()[-1])
  # Re-executed or not, the child stays the process that was started, with
  # its arguments.
  assert result.pop("pid") == process.pid, result
  assert result.pop("argv") == ["an argument"], result
  return result


class HostMemoryTest(absltest.TestCase):

  def test_mimalloc_keeps_what_xla_frees_only_without_purging(self):
    self.assertEqual(_child("1"), {"allocator": "mimalloc",
                                   "imported": "mimalloc",
                                   "xla_purged_mib": 0})
    # The control: with purging on (mimalloc's default delay), each run
    # returns its temporaries to the system.
    control = _child("1", MIMALLOC_PURGE_DELAY="10")
    self.assertEqual(control["allocator"], "mimalloc")
    self.assertGreaterEqual(control["xla_purged_mib"], 256)

  def test_glibc_keeps_freed_blocks_in_the_heap_only_with_it(self):
    self.assertEqual(_child("glibc"), {"allocator": "glibc",
                                       "imported": "glibc", **_GLIBC_KEPT})
    # glibc's default is the opposite in every respect: large blocks are
    # mmapped and unmapped on free, from any thread, and XLA's temporaries
    # leave nothing in the heap.
    self.assertEqual(_child("0"), {"allocator": "", "imported": "",
                                   **{key: not value
                                      for key, value in _GLIBC_KEPT.items()}})

  def test_a_preload_of_the_users_own_is_left_alone(self):
    # Whatever $LD_PRELOAD holds, the child is not re-executed under
    # mimalloc, and glibc's malloc is tuned instead.
    libc = "libc.so.6"
    self.assertEqual(_child("1", LD_PRELOAD=libc)["allocator"], "glibc")

  def test_only_a_main_module_reexecutes(self):
    with absltest.mock.patch.object(os, "execve") as execve:
      self.assertIn(host_memory.keep_freed_memory(), ("glibc", "mimalloc"))
    execve.assert_not_called()

  def test_bad_setting_names_the_valid_ones(self):
    with absltest.mock.patch.dict("os.environ",
                                  {host_memory.ENV_VAR: "yes"}):
      with self.assertRaisesRegex(
          ValueError, r"MAXTEXT_KEEP_FREED_MEMORY is 'yes'.*'0'.*'1'.*"
          "'glibc'"):
        host_memory.keep_freed_memory()

  def test_a_library_path_that_is_no_file_is_named(self):
    missing = os.path.join(absltest.get_default_test_tmpdir(), "nothing.so")
    with absltest.mock.patch.dict("os.environ",
                                  {host_memory.LIBRARY_ENV_VAR: missing,
                                   host_memory.ENV_VAR: "1"}):
      os.environ.pop("LD_PRELOAD", None)
      with absltest.mock.patch.object(host_memory, "mimalloc_loaded",
                                      return_value=False):
        with self.assertRaisesRegex(
            ValueError, "MAXTEXT_MIMALLOC is " + re.escape(repr(missing))):
          host_memory.keep_freed_memory(reexec=True)


if __name__ == "__main__":
  absltest.main()
