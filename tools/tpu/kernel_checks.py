"""The harness's `kernels` suite: each kernel on the device JAX runs on
against its reference on the CPU, forward and gradients.

Every check computes a kernel's outputs and the gradients of a fixed random
weighting of them twice: on the default device (the chip on a TPU machine;
Pallas kernels there run compiled, elsewhere in interpret mode) with inputs
in the check's dtype, and on the CPU in float32 at `highest` matmul
precision with the same inputs (rounded to the dtype first), through the
kernel's reference (plain-JAX kernels are their own reference there). The
error of each output and gradient is its largest difference over the
reference's largest magnitude; a check passes when every error is within
`TOLERANCES` for its dtype. On the chip float32 runs at `highest` precision
too (what a float32 comparison can hold a TPU to), bfloat16 at the default.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Callable, Sequence
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.kernels import attention
from maxtext.kernels import blockwise
from maxtext.kernels import gated_delta_rule
from maxtext.kernels import gmm
from maxtext.kernels import kernel_testing
from maxtext.kernels import paged_attention
from maxtext.kernels import sparse_attention
from maxtext.kernels import splash

# Largest error (max |kernel - reference| over max |reference|) a check
# passes with, per input dtype. float32: summation order and the chip's
# float32 matmul passes (a wrong mask or group is off by O(1)); bfloat16:
# its 8-bit mantissa over reductions of a few hundred terms.
TOLERANCES = {"float32": 2e-4, "bfloat16": 2e-2}


@dataclasses.dataclass(frozen=True)
class Check:
  """One kernel call: `kernel(*arrays)` against `reference(*arrays)`; the
  arrays are the differentiable inputs (what else the call needs is closed
  over); `grads`: compare the gradients too."""

  name: str
  dtype: str
  kernel: Callable[..., jax.Array | tuple[jax.Array, ...]]
  reference: Callable[..., jax.Array | tuple[jax.Array, ...]]
  arrays: tuple[np.ndarray, ...]
  grads: bool = True


def error_line(e: Exception) -> str:
  """A check's failure in one line: the exception's type and first line."""
  return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"


def _on_tpu() -> bool:
  return jax.default_backend() == "tpu"


def _outputs(fn, arrays, grads):
  """fn's outputs and, with `grads`, the gradients of their weighted sum,
  as {name: numpy array}, jitted on the arrays' device."""
  def loss(*arrays):
    outs = fn(*arrays)
    outs = outs if isinstance(outs, tuple) else (outs,)
    rng = np.random.RandomState(7)
    total = sum((o.astype(jnp.float32) * rng.normal(size=o.shape)).sum()
                for o in outs)
    return total, outs

  if grads:
    d, outs = jax.jit(jax.grad(loss, argnums=tuple(range(len(arrays))),
                               has_aux=True))(*arrays)
  else:
    d, outs = (), jax.jit(lambda *a: loss(*a)[1])(*arrays)
  named = {f"out{i}": o for i, o in enumerate(outs)}
  named.update({f"d{i}": g for i, g in enumerate(d)})
  return {k: np.asarray(v, np.float32) for k, v in named.items()}


def evaluate(check: Check) -> dict:
  """Runs `check` on the default device and its reference on the CPU;
  returns {name, dtype, errors: {output: error}, tolerance, passed}, or with
  `error` (the exception, one line) when the kernel fails to run."""
  result = {"name": check.name, "dtype": check.dtype,
            "tolerance": TOLERANCES[check.dtype]}
  cpu = jax.devices("cpu")[0]
  dtype = jnp.dtype(check.dtype)
  inputs = [np.asarray(a).astype(dtype) for a in check.arrays]
  with jax.default_matmul_precision("highest"):
    want = _outputs(check.reference,
                    [jax.device_put(a.astype(np.float32), cpu)
                     for a in inputs], check.grads)
  try:
    with jax.default_matmul_precision(
        "highest" if check.dtype == "float32" else "default"):
      got = _outputs(check.kernel, [jax.device_put(a) for a in inputs],
                     check.grads)
  except Exception as e:  # pylint: disable=broad-exception-caught
    result.update(passed=False, error=error_line(e))
    return result
  errors = {}
  for key, w in want.items():
    scale = max(float(np.abs(w).max(initial=0.0)), 1e-30)
    errors[key] = float(np.abs(got[key] - w).max(initial=0.0)) / scale
  result.update(errors=errors,
                passed=all(e <= result["tolerance"] for e in errors.values()))
  return result


def _attention_checks(small: bool) -> list[Check]:
  """Splash (the chip's kernel; interpret mode elsewhere) and blockwise
  against the reference: causal, GQA, MQA, a window, segment ids, soft-cap
  and sinks; a length the blocks do not divide."""
  length, head_dim, block = (200, 128, 128) if small else (1000, 128, 256)
  interpret = not _on_tpu()
  cases = [("gqa", 8, 2, {}), ("mha_window", 4, 4, dict(window=97)),
           ("mqa_segments_softcap_sinks", 4, 1,
            dict(segments=True, logit_softcap=20.0, sinks=True))]
  if small:
    cases = cases[::2]
  checks = []
  for case, heads, kv_heads, features in cases:
    q, k, v = kernel_testing.inputs(1, length, heads, kv_heads, head_dim)
    kwargs = dict(scale=head_dim**-0.5, window=features.get("window"),
                  logit_softcap=features.get("logit_softcap", 0.0))
    if features.get("segments"):
      kwargs["segment_ids_BL"] = kernel_testing.segments(1, length)
    arrays = (q, k, v)
    if features.get("sinks"):
      arrays += (np.linspace(-1.0, 1.0, heads).astype(np.float32),)

    def bind(fn, **more):
      def call(q, k, v, sinks_H=None):
        return fn(q, k, v, sinks_H=sinks_H, **kwargs, **more)
      return call

    reference = bind(attention.reference_attention)
    for dtype in ("float32", "bfloat16"):
      checks.append(Check(
          f"splash/{case}", dtype,
          bind(splash.splash_attention, block_q=block, block_kv=block,
               interpret=interpret), reference, arrays))
      checks.append(Check(
          f"blockwise/{case}", dtype,
          bind(blockwise.blockwise_attention, block_q=block // 2,
               block_kv=block), reference, arrays))
  return checks


def _gmm_checks(small: bool) -> list[Check]:
  """megablox (compiled on the chip, interpret mode elsewhere), the tiled
  grouped matmul and ragged_dot on the device against ragged_dot on the
  CPU: group sizes that are not multiples of the tile, an empty group, rows
  past the groups, one group."""
  rows, dim, hidden = (200, 128, 256) if small else (1000, 256, 512)
  layouts = {"ragged_empty_rows_past": (0.25, 0.0, 0.35, 0.3),
             "full": (0.4, 0.2, 0.15, 0.25), "one_group": (0.75,)}
  rng = np.random.RandomState(0)
  x = rng.normal(size=(rows, dim)).astype(np.float32)
  checks = []
  for layout, shares in layouts.items():
    sizes = np.int32([round(s * rows) for s in shares])
    sizes[-1] += rows - sizes.sum() if layout == "full" else 0
    w = (0.1 * rng.normal(size=(len(sizes), dim, hidden))).astype(np.float32)
    reference = functools.partial(_ragged_dot, sizes=sizes)
    for dtype in ("float32", "bfloat16"):
      for impl in ("megablox", "tiled", "ragged_dot"):
        checks.append(Check(
            f"gmm_{impl}/{layout}", dtype,
            functools.partial(gmm.grouped_matmul, group_sizes_E=sizes,
                              impl=impl, interpret=not _on_tpu()),
            reference, (x, w)))
  return checks


def _ragged_dot(x, w, sizes):
  return jax.lax.ragged_dot(x, w, sizes)


def _paged_checks(small: bool) -> list[Check]:
  """Paged decode attention (the chip's Pallas kernel where it serves the
  call, the plain-JAX scan elsewhere and with a window or sinks) against
  the dense gather."""
  batch, page_size, pages, heads, kv_heads, dim = (
      (3, 16, 4, 4, 2, 128) if small else (8, 16, 16, 8, 2, 128))
  rng = np.random.RandomState(0)
  num_pages = batch * pages + 3
  table = rng.permutation(num_pages)[:batch * pages].reshape(
      batch, pages).astype(np.int32)
  lengths = np.int32(rng.randint(1, pages * page_size + 1, size=batch))
  lengths[0] = pages * page_size
  q = rng.normal(size=(batch, heads, dim)).astype(np.float32)
  k_pages, v_pages = (rng.normal(size=(num_pages, page_size, kv_heads, dim))
                      .astype(np.float32) for _ in range(2))
  checks = []
  for case, kwargs, extra in (
      ("plain", dict(scale=dim**-0.5), ()),
      ("softcap", dict(scale=dim**-0.5, logit_softcap=5.0), ()),
      ("window_sinks", dict(scale=dim**-0.5, window=21),
       (np.linspace(-1, 1, heads).astype(np.float32),))):

    def bind(fn, kwargs=kwargs, **more):
      def call(q, k, v, sinks_H=None):
        return fn(q, k, v, table, lengths, sinks_H=sinks_H, **kwargs,
                  **more)
      return call

    for dtype in ("float32", "bfloat16"):
      checks.append(Check(
          f"paged_attention/{case}", dtype,
          bind(paged_attention.paged_attention, impl="auto"),
          bind(paged_attention.reference_paged_attention),
          (q, k_pages, v_pages) + extra, grads=False))
  return checks


def _sparse_checks(small: bool) -> list[Check]:
  """DeepSeek Sparse Attention (top-k of the indexer, then latent attention
  over the selected tokens) on the device against the CPU, float32 only:
  bfloat16 index scores reorder near-tied tokens, which changes the
  selection rather than testing the kernel."""
  batch, length, heads, rope, latent, index_heads, index_dim = (
      (1, 40, 3, 8, 16, 2, 8) if small else (2, 512, 8, 64, 128, 4, 64))
  rng = np.random.default_rng(0)

  def normal(*shape):
    return rng.normal(size=shape).astype(np.float32)

  positions = np.broadcast_to(np.arange(length, dtype=np.int32),
                              (batch, length))
  arrays = (normal(batch, length, heads, latent),
            normal(batch, length, heads, rope), normal(batch, length, latent),
            normal(batch, length, rope))
  index = (np.abs(normal(batch, length, index_heads, index_dim)),
           np.abs(normal(batch, length, index_dim)),
           normal(batch, length, index_heads))

  def call(qc, qr, c, r):
    return sparse_attention.sparse_attention(
        qc, qr, c, r, *index, top_k=length // 4, scale=0.1,
        index_scale=index_dim**-0.5, q_positions_BL=positions,
        k_positions_BS=positions, block=min(64, length))

  return [Check("sparse_attention/top_quarter", "float32", call, call,
                arrays)]


def _delta_rule_checks(small: bool) -> list[Check]:
  """The chunked gated delta rule against the token-by-token reference,
  with packed segments: outputs, final state and gradients."""
  batch, length, heads, key_dim, value_dim, chunk = (
      (1, 37, 2, 8, 8, 8) if small else (2, 1000, 4, 128, 128, 64))
  rng = np.random.default_rng(0)
  q, k = (rng.normal(size=(batch, length, heads, key_dim)) for _ in range(2))
  q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
  arrays = tuple(x.astype(np.float32) for x in (
      q * key_dim**-0.5, k, rng.normal(size=(batch, length, heads,
                                             value_dim)),
      -np.abs(rng.normal(size=(batch, length, heads))) * 0.5,
      1 / (1 + np.exp(-rng.normal(size=(batch, length, heads))))))
  segments = np.zeros((batch, length), np.int32)
  segments[:, length // 3:] = 1
  segments[:, length // 2:] = 2
  return [Check(
      "gated_delta_rule/chunked_segments", dtype,
      functools.partial(gated_delta_rule.chunked, chunk=chunk,
                        segment_ids_BL=segments),
      functools.partial(gated_delta_rule.reference, segment_ids_BL=segments),
      arrays) for dtype in ("float32", "bfloat16")]


SUITES = (_attention_checks, _gmm_checks, _paged_checks, _sparse_checks,
          _delta_rule_checks)


def checks(small: bool) -> list[Check]:
  """Every check; `small`: shapes a CPU runs in seconds (interpret mode)."""
  return [c for suite in SUITES for c in suite(small)]


def run(small: bool, only: Sequence[str] = ()) -> list[dict]:
  """Evaluates the checks whose names start with one of `only` (all when
  empty), printing a line for each."""
  results = []
  for check in checks(small):
    if only and not any(check.name.startswith(p) for p in only):
      continue
    result = evaluate(check)
    worst = max(result.get("errors", {}).values(), default=float("nan"))
    print(f"{'ok  ' if result['passed'] else 'FAIL'} {check.name}"
          f" {check.dtype}: max error {worst:.2e} (tolerance"
          f" {result['tolerance']:.0e})"
          + (f" {result['error']}" if "error" in result else ""),
          flush=True)
    results.append(result)
  return results
