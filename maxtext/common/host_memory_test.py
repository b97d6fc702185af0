"""host_memory: freed blocks stay in malloc's heap, for XLA's temporaries too.

Each case runs a child process (the setting must precede its threads) that
calls `keep_freed_memory()` first and then reads glibc's own accounting
(`mallinfo2`): which blocks were mmapped (and so unmapped again on free) and
how many free bytes the heap keeps. The same child with
$MAXTEXT_KEEP_FREED_MEMORY=0 is the control. Page faults are the effect
that matters (tools/bench/README.md measures them), but their count depends
on the machine (these VMs' kernel reclaims idle pages on its own), while
malloc's accounting does not.
"""

import json
import subprocess
import sys

from absl.testing import absltest

from maxtext.common import host_memory
from testing import train_process

_CHILD = """
import ctypes
import json
import threading
import time
from maxtext.common import host_memory
kept = host_memory.keep_freed_memory()

class MallInfo2(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in (
      "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
      "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
MIB = 2**20
out = {"kept": kept}

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
# XLA frees a run's temporaries after its outputs are ready, on its own
# thread: wait until nothing of 256 MiB is in use (in the heap or mmapped).
deadline = time.monotonic() + 60
while (info := libc.mallinfo2()).uordblks + info.hblkhd >= 256 * MIB:
  if time.monotonic() > deadline:
    raise TimeoutError(f"XLA's temporaries still in use: {info.uordblks}"
                       f" bytes in the heap, {info.hblkhd} mmapped")
  time.sleep(0.01)
out["xla_free_kept"] = info.fordblks >= 256 * MIB
print(json.dumps(out))
"""


def _child(setting: str) -> dict[str, bool]:
  env = train_process.child_env(1)
  env[host_memory.ENV_VAR] = setting
  out = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True,
                       capture_output=True, text=True).stdout
  return json.loads(out.splitlines()[-1])


class HostMemoryTest(absltest.TestCase):

  def test_freed_blocks_stay_in_the_heap_only_with_it(self):
    want = {"kept": True, "main_mmapped": False, "main_free_kept": True,
            "thread_mmapped": False, "thread_free_kept": True,
            "xla_free_kept": True}
    self.assertEqual(_child("1"), want)
    # glibc's default is the opposite in every respect: large blocks are
    # mmapped and unmapped on free, from any thread, and XLA's temporaries
    # leave nothing in the heap.
    self.assertEqual(_child("0"), {key: not value
                                   for key, value in want.items()})

  def test_bad_setting_names_the_valid_ones(self):
    with absltest.mock.patch.dict("os.environ",
                                  {host_memory.ENV_VAR: "yes"}):
      with self.assertRaisesRegex(ValueError,
                                  r"MAXTEXT_KEEP_FREED_MEMORY is 'yes'.*'0'"):
        host_memory.keep_freed_memory()


if __name__ == "__main__":
  absltest.main()
