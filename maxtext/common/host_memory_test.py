"""host_memory: a program's temporaries stop page-faulting from call to call.

Each case runs a child process (the setting must precede its threads) that
calls `keep_freed_memory()` first, then runs a jitted function with a 64 MiB
temporary and counts the minor page faults of 5 calls after 10
(`resource.getrusage`); the same child with $MAXTEXT_KEEP_FREED_MEMORY=0 is
the control.
"""

import json
import subprocess
import sys

from absl.testing import absltest

from maxtext.common import host_memory
from testing import train_process

_CHILD = """
import json
import resource
from maxtext.common import host_memory
kept = host_memory.keep_freed_memory()
import jax
import jax.numpy as jnp
# (x @ w) is a [16384, 1024] float32 temporary: 64 MiB, above any mmap
# threshold of glibc's malloc.
step = jax.jit(lambda x, w: (x @ w) @ w.T)
x, w = jnp.ones((16384, 256)), jnp.ones((256, 1024)) / 1024
for _ in range(10):
  step(x, w).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
  step(x, w).block_until_ready()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"kept": kept, "faults": faults}))
"""
_PAGES_64_MIB = 64 * 2**20 // 4096


def _child(setting: str) -> dict[str, object]:
  env = train_process.child_env(1)
  env[host_memory.ENV_VAR] = setting
  out = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True,
                       capture_output=True, text=True).stdout
  return json.loads(out.splitlines()[-1])


class HostMemoryTest(absltest.TestCase):

  def test_temporaries_fault_only_without_it(self):
    kept, control = _child("1"), _child("0")
    self.assertTrue(kept["kept"])
    self.assertFalse(control["kept"])
    # The control faults the temporary in again on each of the 5 calls; with
    # the setting, the calls reuse the memory of the first ones. Under load
    # the runtime may free a call's buffers after the next call allocated
    # its own, and the heap then grows once more: up to two temporaries.
    self.assertGreater(control["faults"], 5 * _PAGES_64_MIB / 2)
    self.assertLess(kept["faults"], 2 * _PAGES_64_MIB)

  def test_bad_setting_names_the_valid_ones(self):
    with absltest.mock.patch.dict("os.environ",
                                  {host_memory.ENV_VAR: "yes"}):
      with self.assertRaisesRegex(ValueError,
                                  r"MAXTEXT_KEEP_FREED_MEMORY is 'yes'.*'0'"):
        host_memory.keep_freed_memory()


if __name__ == "__main__":
  absltest.main()
