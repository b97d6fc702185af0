"""XLA compiler options of the train step: LLVM -O1 for CPU kernels.

XLA's CPU backend compiles each fused kernel with LLVM, by default at -O2
(`xla_backend_optimization_level` 2), and that code generation is most of a
train step's compile. At -O1 issue #14's `tiny` compiled in 1.6-1.7 s
instead of 1.9-2.4 s and `small` in 2.6-2.7 s instead of 3.0-4.2 s on 1
device (3.8 s instead of 4.4 s on 8), with steps equal within noise
(`tools/bench/README.md`): a step's time goes to the matmuls, which are
library calls (YNNPACK, Eigen), not generated code.

Only for CPU devices: other backends keep their defaults. A level the user
sets in $XLA_FLAGS wins.
"""

import os

import jax

CPU_OPTIONS = {"xla_backend_optimization_level": 1}


def compiler_options(devices) -> dict[str, int]:
  """Options for `Lowered.compile(compiler_options=...)` of a program that
  runs on `devices` (a mesh's devices)."""
  platforms = {device.platform for device in devices}
  if platforms != {"cpu"}:
    return {}
  xla_flags = os.environ.get("XLA_FLAGS", "")
  return {name: value for name, value in CPU_OPTIONS.items()
          if f"--{name}" not in xla_flags}


def compile_for(lowered: jax.stages.Lowered,
                mesh: jax.sharding.Mesh) -> jax.stages.Compiled:
  """`lowered` compiled with the options for `mesh`'s devices."""
  return lowered.compile(
      compiler_options=compiler_options(mesh.devices.flat) or None)
