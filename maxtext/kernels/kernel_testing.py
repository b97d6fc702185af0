"""Test inputs shared by the attention-kernel tests: random queries, keys
and values, random packed-segment ids, and the output and gradients of a
weighted sum of a kernel's output (what a kernel test compares with the
reference's).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def inputs(
    batch: int,
    length: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    value_dim: int | None = None,
    dtype: jax.typing.DTypeLike = np.float32,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Standard-normal q, k and v from `np.random.RandomState(seed)`.

  The three are drawn in that order in float64 and rounded once to `dtype`.

  Args:
    batch: B.
    length: L, of the queries and of the keys and values.
    num_heads: H.
    num_kv_heads: G.
    head_dim: K, of the queries and keys.
    value_dim: V, the values' head dim; `head_dim` when None.
    dtype: the arrays' dtype (a numpy or ml_dtypes one, e.g. jnp.bfloat16).
    seed: of the RandomState.

  Returns:
    q_BLHK, k_BLGK, v_BLGU.
  """
  rng = np.random.RandomState(seed)
  q_BLHK = rng.normal(size=(batch, length, num_heads, head_dim))
  k_BLGK = rng.normal(size=(batch, length, num_kv_heads, head_dim))
  v_BLGU = rng.normal(size=(batch, length, num_kv_heads,
                            head_dim if value_dim is None else value_dim))
  return tuple(x.astype(dtype) for x in (q_BLHK, k_BLGK, v_BLGU))


def segments(batch: int, length: int, *, seed: int = 3,
             count: int = 4) -> np.ndarray:
  """Packed-sequence segment ids: per row, sorted uniform draws from
  [0, count) (so segments are contiguous, some may be empty).

  Returns:
    int32 segment_ids_BL from `np.random.RandomState(seed)`.
  """
  rng = np.random.RandomState(seed)
  return np.sort(rng.randint(0, count, size=(batch, length)), axis=1).astype(
      np.int32)


def value_and_grads(
    fn: Callable[..., jax.Array],
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    sinks: jax.Array | None,
    **kwargs,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """Output and gradients of sum(o * w) for o = fn(q, k, v, ...), jitted.

  The weights w (float32, shape of o: (B, L, H, V)) come from
  `np.random.RandomState(7)`, so a kernel and the reference get the same
  ones; a non-uniform w makes every output element matter to the
  gradients. Jitted because Pallas interpret mode is slow eagerly.

  Args:
    fn: an attention kernel with the signature of
      `attention.reference_attention`.
    q: the queries (B, L, H, K).
    k: the keys (B, S, G, K).
    v: the values (B, S, G, V).
    sinks: the per-head sink logits (H,), or None for none.
    **kwargs: passed to `fn` (closed over, so they may be static).

  Returns:
    The output o and the gradients w.r.t. (q, k, v), or (q, k, v, sinks)
    when `sinks` is given.
  """
  weights = np.random.RandomState(7).normal(
      size=(*q.shape[:3], v.shape[-1])).astype(np.float32)

  def loss(q, k, v, sinks):
    o = fn(q, k, v, sinks_H=sinks, **kwargs)
    return (o.astype(jnp.float32) * weights).sum(), o

  argnums = (0, 1, 2) if sinks is None else (0, 1, 2, 3)
  grads, out = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))(
      q, k, v, sinks)
  return out, grads
