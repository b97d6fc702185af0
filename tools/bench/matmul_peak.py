"""The matmul FLOP/s this machine reaches in a dtype, measured on the spot.

A large square matmul, jitted, timed `repeats` times after a warm-up call;
the median counts. MFU against this figure means something on a CPU (whose
peak no table knows) and on a shared machine (where the nominal peak is out
of reach):

  tools/bazel run //tools/bench:matmul_peak -- --dtype=float32 --size=2048
"""

import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Operand dtype.")
_SIZE = flags.DEFINE_integer("size", 2048, "Matrix side.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls.", lower_bound=1)


def matmul_flops_per_s(dtype: str, *, size: int = 2048,
                       repeats: int = 5) -> float:
  """Median FLOP/s of a jitted [size, size] @ [size, size] in `dtype`.

  Raises:
    ValueError: `size` or `repeats` below 1.
  """
  if size < 1 or repeats < 1:
    raise ValueError(f"size={size} and repeats={repeats} must be >= 1.")
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (size, size), dtype)
  b = jax.random.normal(key_b, (size, size), dtype)
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(matmul(a, b))
    seconds.append(time.perf_counter() - start)
  return 2 * size**3 / statistics.median(seconds)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  flops = matmul_flops_per_s(_DTYPE.value, size=_SIZE.value,
                             repeats=_REPEATS.value)
  print(f"{jax.devices()[0].device_kind} {_DTYPE.value} matmul"
        f" {_SIZE.value}^3: {flops / 1e12:.4f} TFLOP/s (median of"
        f" {_REPEATS.value})")


if __name__ == "__main__":
  app.run(main)
