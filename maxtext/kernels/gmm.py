"""Grouped matrix multiplication for mixture-of-experts layers.

Rows of `lhs_TD` are sorted by group (expert): the first `group_sizes_E[0]`
rows multiply `rhs_EDF[0]`, the next `group_sizes_E[1]` rows `rhs_EDF[1]`,
and so on; rows past the sum of the sizes give zeros. Three implementations,
one signature:

  ragged_dot  `jax.lax.ragged_dot` (the reference; every platform), its
              rows past the groups zeroed here (the TPU's computes them
              wrong) and one group a plain matmul (the TPU's fails to
              compile one). Off TPU and GPU, jax lowers it densely: every
              row times every group's matrix, masked, G times the FLOPs of
              the rows.
  megablox    the TPU Pallas kernel shipped with jax
              (`jax.experimental.pallas.ops.tpu.megablox.gmm`, with its own
              VJP); M is padded to the row tile here.
  tiled       block-sparse in plain JAX (MegaBlocks' layout): each group's
              rows padded to a multiple of the row tile (capped at M), and
              a loop over the tiles that hold rows, each multiplied by its
              group's matrix, forward and backward (a custom VJP): the
              FLOPs of the rows in groups, padded, and none for the rows
              past them.
  auto        megablox on a single TPU device with K and N multiples of
              128 (its tiles); tiled on CPU (`skips_unused_rows`);
              ragged_dot elsewhere: XLA partitions ragged_dot but cannot
              partition a Pallas kernel, and inside the expert-parallel
              `jax.shard_map` of `maxtext.layers.moe_parallel`
              (check_vma=True) megablox's outputs lack the varying-axes
              annotation it needs.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox

from maxtext.kernels import backend

IMPLS = ("auto", "ragged_dot", "megablox", "tiled")


def _zeros_past_groups(matmul, lhs_TD, group_sizes_E):
  """`matmul(lhs_TD)` with the rows past the groups zero in the output and
  in the lhs gradient: megablox leaves them unwritten, and the TPU's
  ragged_dot computes them wrong (tools/tpu's kernel checks on a v5e,
  libtpu 0.0.42.1). Selects, so garbage never leaks."""
  in_group_T1 = (jnp.arange(lhs_TD.shape[0])[:, None] <
                 jnp.sum(group_sizes_E))
  return jnp.where(in_group_T1, matmul(jnp.where(in_group_T1, lhs_TD, 0)),
                   0)


def _megablox(lhs_TD, rhs_EDF, group_sizes_E, tiling, interpret):
  rows = lhs_TD.shape[0]
  tile_m, tile_k, tile_n = tiling
  lhs_TD = jnp.pad(lhs_TD, ((0, -rows % tile_m), (0, 0)))
  tiling = (tile_m, min(tile_k, lhs_TD.shape[1]),
            min(tile_n, rhs_EDF.shape[2]))
  return _zeros_past_groups(
      lambda lhs: megablox.gmm(lhs, rhs_EDF, group_sizes_E.astype(jnp.int32),
                               lhs.dtype, tiling, None, None, False,
                               interpret), lhs_TD, group_sizes_E)[:rows]


def _ragged_dot(lhs_TD, rhs_EDF, group_sizes_E):
  # One group is a plain matmul: the TPU compiler fails on a ragged_dot of
  # one group (a RET_CHECK in its mask lowering, libtpu 0.0.42.1).
  if rhs_EDF.shape[0] == 1:
    return _zeros_past_groups(lambda lhs: jnp.dot(lhs, rhs_EDF[0]), lhs_TD,
                              group_sizes_E)
  return _zeros_past_groups(
      lambda lhs: jax.lax.ragged_dot(lhs, rhs_EDF, group_sizes_E), lhs_TD,
      group_sizes_E)


def _zeros(shape, dtype, *like):
  """Zeros that vary over every mesh axis any of `like` varies over inside
  `jax.shard_map` (`zeros_like` keeps its argument's varying axes, and sums
  join them)."""
  return sum(jnp.zeros_like(a, dtype, shape=shape) for a in like)


def _live_tiles_matmul(x_PSD, rhs_EDF, group_P, live):
  """out[p] = x_PSD[p] @ rhs_EDF[group_P[p]] for the first `live` tiles
  (a dynamic count), zeros after: a loop that runs only the tiles holding
  rows, forward and backward."""
  # Inside `jax.shard_map`, the custom VJP's gradients must vary as its
  # inputs do: let both inputs vary as all four do (autodiff sums the
  # gradients of what did not vary over those axes).
  like = (x_PSD, rhs_EDF, group_P, live)
  return _live_tiles(x_PSD + _zeros(x_PSD.shape, x_PSD.dtype, *like),
                     rhs_EDF + _zeros(rhs_EDF.shape, rhs_EDF.dtype, *like),
                     group_P, live)


@jax.custom_vjp
def _live_tiles(x_PSD, rhs_EDF, group_P, live):
  """`_live_tiles_matmul` of inputs that vary alike: `x_PSD` varies as
  every input, output and cotangent does, so zeros like it suit every
  carry."""
  def body(p, out_PSF):
    tile_SF = jnp.dot(x_PSD[p], rhs_EDF[group_P[p]],
                      preferred_element_type=x_PSD.dtype)
    return jax.lax.dynamic_update_index_in_dim(out_PSF, tile_SF, p, 0)

  out = jnp.zeros_like(x_PSD, shape=x_PSD.shape[:2] + rhs_EDF.shape[2:])
  return jax.lax.fori_loop(0, live, body, out)


def _live_tiles_fwd(x_PSD, rhs_EDF, group_P, live):
  return (_live_tiles(x_PSD, rhs_EDF, group_P, live),
          (x_PSD, rhs_EDF, group_P, live))


def _live_tiles_bwd(res, d_PSF):
  x_PSD, rhs_EDF, group_P, live = res

  def body(p, grads):
    dx_PSD, drhs_EDF = grads
    g = group_P[p]
    dx_SD = jnp.dot(d_PSF[p], rhs_EDF[g].T,
                    preferred_element_type=x_PSD.dtype)
    # Each group's matrix sums its tiles' products in float32.
    drhs_DF = jnp.dot(x_PSD[p].T, d_PSF[p],
                      preferred_element_type=jnp.float32)
    return (jax.lax.dynamic_update_index_in_dim(dx_PSD, dx_SD, p, 0),
            drhs_EDF.at[g].add(drhs_DF))

  dx_PSD, drhs_EDF = jax.lax.fori_loop(0, live, body, (
      jnp.zeros_like(x_PSD),
      jnp.zeros_like(x_PSD, jnp.float32, shape=rhs_EDF.shape)))
  return dx_PSD, drhs_EDF.astype(rhs_EDF.dtype), None, None


_live_tiles.defvjp(_live_tiles_fwd, _live_tiles_bwd)


def _tiled(lhs_TD, rhs_EDF, group_sizes_E, tile):
  rows, groups = lhs_TD.shape[0], rhs_EDF.shape[0]
  # A tile taller than all the rows would only multiply padding.
  tile = max(1, min(tile, rows))
  sizes_E = jnp.asarray(group_sizes_E, jnp.int32)
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
  out_PSF = _live_tiles_matmul(x_PSD, rhs_EDF, group_P, tile_ends_E[-1])
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


def skips_unused_rows() -> bool:
  """Whether "auto" computes only the rows in groups (the tiled loop, on
  CPU), rather than every row of the static buffer."""
  return backend.target_platform() == "cpu"


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
    if skips_unused_rows():
      impl = "tiled"
    else:
      impl = ("megablox" if platform == "tpu" and backend.single_device()
              and lane_aligned else "ragged_dot")
  if impl == "megablox":
    return _megablox(lhs_TD, rhs_EDF, group_sizes_E, tiling, interpret)
  if impl == "tiled":
    return _tiled(lhs_TD, rhs_EDF, group_sizes_E, tiling[0])
  return _ragged_dot(lhs_TD, rhs_EDF, group_sizes_E)
