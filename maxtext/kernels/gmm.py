"""Grouped matrix multiplication for mixture-of-experts layers.

Rows of `lhs_TD` are sorted by group (expert): the first `group_sizes_E[0]`
rows multiply `rhs_EDF[0]`, the next `group_sizes_E[1]` rows `rhs_EDF[1]`,
and so on; rows past the sum of the sizes give zeros. Two implementations,
one signature:

  ragged_dot  `jax.lax.ragged_dot` (the reference; every platform).
  megablox    the TPU Pallas kernel shipped with jax
              (`jax.experimental.pallas.ops.tpu.megablox.gmm`, with its own
              VJP); M is padded to the row tile here.
  auto        megablox on a single TPU device with K and N multiples of
              128 (its tiles), ragged_dot elsewhere: XLA partitions
              ragged_dot but cannot partition a Pallas kernel, and inside
              the expert-parallel `jax.shard_map` of
              `maxtext.layers.moe_experts` (check_vma=True) megablox's
              outputs lack the varying-axes annotation it needs.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox

from maxtext.kernels import backend

IMPLS = ("auto", "ragged_dot", "megablox")


def _megablox(lhs_TD, rhs_EDF, group_sizes_E, tiling, interpret):
  rows = lhs_TD.shape[0]
  tile_m, tile_k, tile_n = tiling
  lhs_TD = jnp.pad(lhs_TD, ((0, -rows % tile_m), (0, 0)))
  tiling = (tile_m, min(tile_k, lhs_TD.shape[1]),
            min(tile_n, rhs_EDF.shape[2]))
  # The kernel leaves rows past the groups unwritten, in the output and in
  # the lhs gradient: select zeros there (selects, so garbage never leaks).
  in_group_M1 = jnp.arange(lhs_TD.shape[0])[:, None] < group_sizes_E.sum()
  lhs_TD = jnp.where(in_group_M1, lhs_TD, 0)
  out_TF = megablox.gmm(lhs_TD, rhs_EDF, group_sizes_E.astype(jnp.int32),
                        lhs_TD.dtype, tiling, None, None, False, interpret)
  return jnp.where(in_group_M1, out_TF, 0)[:rows]


def grouped_matmul(
    lhs_TD: jax.Array,
    rhs_EDF: jax.Array,
    group_sizes_E: jax.Array,
    *,
    impl: str = "auto",
    tiling: tuple[int, int, int] = (128, 128, 128),
    interpret: bool = False,
) -> jax.Array:
  """out[i] = lhs_TD[i] @ rhs_EDF[group of row i]; see the module docstring.

  Args:
    lhs_TD: Rows sorted by group.
    rhs_EDF: One matrix per group.
    group_sizes_E: Rows per group (integers summing to at most M).
    impl: One of `IMPLS`.
    tiling: megablox (M, K, N) tiles; K and N tiles are capped at the dims.
    interpret: Run megablox in Pallas interpret mode (any backend; slow).

  Returns:
    [T, F] in the dtype of `lhs_TD`.

  Raises:
    ValueError: `impl` is unknown.
  """
  if impl not in IMPLS:
    raise ValueError(f"Unknown grouped-matmul impl {impl!r}; valid: {IMPLS}.")
  if impl == "auto":
    lane_aligned = lhs_TD.shape[1] % 128 == 0 and rhs_EDF.shape[2] % 128 == 0
    impl = ("megablox" if backend.target_platform() == "tpu" and
            backend.single_device() and lane_aligned else "ragged_dot")
  if impl == "megablox":
    return _megablox(lhs_TD, rhs_EDF, group_sizes_E, tiling, interpret)
  return jax.lax.ragged_dot(lhs_TD, rhs_EDF, group_sizes_E)
