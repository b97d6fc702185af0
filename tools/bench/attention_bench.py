"""Attention training speed and memory per implementation and length.

For each sequence length and implementation, compiles one attention forward
and backward (gradients of q, k and v) and prints tokens/s (median of
`--repeats` timed calls; the implementations are timed in turn, round after
round, so load from other jobs falls on all of them alike) and XLA's
compiled scratch memory (`memory_analysis().temp_size_in_bytes`). With
`--check` it also prints each implementation's error against the float32
reference at the highest matmul precision on the same inputs: the largest
|difference| of the output and of each gradient (for a random output
cotangent), relative to that tensor's largest |value|.
Implementations that cannot run here (e.g. splash off TPU) are skipped.

  tools/bazel run //tools/bench:attention_bench -- \
      --lengths=1024,4096 --impls=reference,blockwise,xla
"""

import functools
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.kernels import dispatch

_LENGTHS = flags.DEFINE_list("lengths", ["1024", "2048", "4096"],
                             "Sequence lengths.")
_IMPLS = flags.DEFINE_list("impls", ["reference", "blockwise", "xla"],
                           f"Implementations, of {dispatch.IMPLS}.")
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences per call.")
_HEADS = flags.DEFINE_integer("heads", 8, "Query heads.")
_KV_HEADS = flags.DEFINE_integer("kv_heads", 2, "Key/value heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head dim.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Activation dtype.")
_BLOCK = flags.DEFINE_integer("block", 512, "block_q and block_kv.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds.")
_CHECK = flags.DEFINE_bool(
    "check", False, "Also print each implementation's relative error against"
    " the float32 reference (the reference's [L, L] logits must fit).")


def _attention(impl: str, q, k, v):
  return dispatch.attention(q, k, v, impl=impl, scale=_HEAD_DIM.value**-0.5,
                            block_q=_BLOCK.value, block_kv=_BLOCK.value)


def _outputs_and_grads(impl: str, inputs, cotangent):
  """(output, dq, dk, dv) of `impl` on `inputs` for output `cotangent`."""
  out, vjp = jax.vjp(functools.partial(_attention, impl), *inputs)
  return (out, *vjp(cotangent.astype(out.dtype)))


def _relative_error(impl: str, inputs) -> float:
  """The largest relative error of `impl`'s output and gradients against
  the float32 reference (module docstring)."""
  cotangent = jax.random.normal(jax.random.key(1), inputs[0].shape[:2]
                                + (inputs[0].shape[2], inputs[2].shape[3]))
  got = jax.jit(functools.partial(_outputs_and_grads, impl))(inputs,
                                                             cotangent)
  with jax.default_matmul_precision("highest"):
    want = jax.jit(functools.partial(_outputs_and_grads, "reference"))(
        [x.astype(jnp.float32) for x in inputs], cotangent)
  return max(float(jnp.abs(g.astype(jnp.float32) - w).max()
                   / jnp.abs(w).max()) for g, w in zip(got, want))


def _compiled_step(impl: str, length: int):
  """Jitted fwd+bwd of `impl`, compiled, and its inputs."""
  dtype = jnp.dtype(_DTYPE.value)
  rng = np.random.default_rng(0)

  def array(heads):
    return jnp.asarray(rng.normal(size=(_BATCH.value, length, heads,
                                        _HEAD_DIM.value)), dtype)

  inputs = (array(_HEADS.value), array(_KV_HEADS.value),
            array(_KV_HEADS.value))

  def loss(q, k, v):
    return _attention(impl, q, k, v).astype(jnp.float32).sum()

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
      *inputs).compile()
  return compiled, inputs


def main(argv):
  del argv
  print(f"backend={jax.default_backend()} batch={_BATCH.value} heads="
        f"{_HEADS.value}/{_KV_HEADS.value} head_dim={_HEAD_DIM.value} "
        f"dtype={_DTYPE.value} block={_BLOCK.value}")
  print(f"{'length':>7} {'impl':>10} {'tokens/s':>12} {'temp MiB':>10}"
        + (f" {'rel. error':>10}" if _CHECK.value else ""))
  for length in map(int, _LENGTHS.value):
    steps = {}
    for impl in _IMPLS.value:
      try:
        steps[impl] = _compiled_step(impl, length)
      except ValueError as e:
        print(f"{length:>7} {impl:>10} skipped: {e}")
    times = {impl: [] for impl in steps}
    for impl, (compiled, inputs) in steps.items():  # Warm up.
      jax.block_until_ready(compiled(*inputs))
    for _ in range(_REPEATS.value):
      for impl, (compiled, inputs) in steps.items():
        start = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))
        times[impl].append(time.perf_counter() - start)
    for impl, (compiled, inputs) in steps.items():
      tokens_per_s = _BATCH.value * length / statistics.median(times[impl])
      temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
      error = (f" {_relative_error(impl, inputs):>10.2e}" if _CHECK.value
               else "")
      print(f"{length:>7} {impl:>10} {tokens_per_s:>12,.0f} {temp:>10,.1f}"
            + error)


if __name__ == "__main__":
  app.run(main)
