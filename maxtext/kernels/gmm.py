"""Grouped matrix multiplication for mixture-of-experts layers.

Rows of `lhs_TD` are sorted by group (expert): the first `group_sizes_E[0]`
rows multiply `rhs_EDF[0]`, the next `group_sizes_E[1]` rows `rhs_EDF[1]`,
and so on; rows past the sum of the sizes give zeros. Three implementations,
one signature:

  ragged_dot  `jax.lax.ragged_dot` (the reference; every platform). Off
              TPU and GPU, jax lowers it densely: every row times every
              group's matrix, masked, G times the FLOPs of the rows.
  megablox    the TPU Pallas kernel shipped with jax
              (`jax.experimental.pallas.ops.tpu.megablox.gmm`, with its own
              VJP); M is padded to the row tile here.
  tiled       block-sparse in plain JAX (MegaBlocks' layout): each group's
              rows padded to a multiple of the row tile, each tile
              multiplied by its group's matrix (gathered per tile) in one
              batched matmul; (M + G * tile) rows of FLOPs, a static
              ceil(M / tile) + G tiles. Differentiable by JAX.
  auto        megablox on a single TPU device with K and N multiples of
              128 (its tiles); tiled on CPU with more than one group (one
              group's dense lowering is the plain matmul, and tiled's
              gathers would only add to it); ragged_dot elsewhere: XLA
              partitions ragged_dot but cannot partition a Pallas kernel,
              and inside the expert-parallel `jax.shard_map` of
              `maxtext.layers.moe_experts` (check_vma=True) megablox's
              outputs lack the varying-axes annotation it needs.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox

from maxtext.kernels import backend

IMPLS = ("auto", "ragged_dot", "megablox", "tiled")


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


def _tiled(lhs_TD, rhs_EDF, group_sizes_E, tile):
  rows, groups = lhs_TD.shape[0], rhs_EDF.shape[0]
  sizes_E = group_sizes_E.astype(jnp.int32)
  # Group g's rows start at starts_E[g] here and at tile_starts_E[g] * tile
  # in the padded layout, where it has tiles_E[g] tiles.
  ends_E = jnp.cumsum(sizes_E)
  starts_E = ends_E - sizes_E
  tiles_E = (sizes_E + tile - 1) // tile
  tile_ends_E = jnp.cumsum(tiles_E)
  tile_starts_E = tile_ends_E - tiles_E
  # Each group pads fewer than `tile` rows.
  num_tiles = -(-rows // tile) + groups
  # Tiles past the last group's run no group: zeros, group 0's matrix.
  tile_P = jnp.arange(num_tiles)
  group_P = jnp.searchsorted(tile_ends_E, tile_P, side="right")
  live_P = group_P < groups
  group_P = jnp.where(live_P, group_P, 0)
  # Padded row (tile p, slot s): row starts_E[g] + (p - tile_starts_E[g]) *
  # tile + s of group g, where it is in the group.
  offset_PS = ((tile_P - tile_starts_E[group_P])[:, None] * tile +
               jnp.arange(tile)[None, :])
  valid_PS = live_P[:, None] & (offset_PS < sizes_E[group_P][:, None])
  source_PS = jnp.where(valid_PS, starts_E[group_P][:, None] + offset_PS, 0)
  x_PSD = jnp.where(valid_PS[..., None], lhs_TD[source_PS], 0)
  out_PSF = jnp.einsum("psd,pdf->psf", x_PSD, rhs_EDF[group_P],
                       preferred_element_type=lhs_TD.dtype)
  # Row i of group g is padded row tile_starts_E[g] * tile + i -
  # starts_E[g]; rows past the groups give zeros.
  row_T = jnp.arange(rows)
  group_T = jnp.minimum(jnp.searchsorted(ends_E, row_T, side="right"),
                        groups - 1)
  padded_T = tile_starts_E[group_T] * tile + row_T - starts_E[group_T]
  in_group_T1 = (row_T < ends_E[-1])[:, None]
  out_PF = out_PSF.reshape(num_tiles * tile, -1)
  return jnp.where(in_group_T1, out_PF[jnp.where(in_group_T1[:, 0],
                                                 padded_T, 0)], 0)


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
      tiled uses the M tile.
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
    platform = backend.target_platform()
    if platform == "cpu" and rhs_EDF.shape[0] > 1:
      impl = "tiled"
    else:
      impl = ("megablox" if platform == "tpu" and backend.single_device()
              and lane_aligned else "ragged_dot")
  if impl == "megablox":
    return _megablox(lhs_TD, rhs_EDF, group_sizes_E, tiling, interpret)
  if impl == "tiled":
    return _tiled(lhs_TD, rhs_EDF, group_sizes_E, tiling[0])
  return jax.lax.ragged_dot(lhs_TD, rhs_EDF, group_sizes_E)
