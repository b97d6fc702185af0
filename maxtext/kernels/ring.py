"""Ring attention: causal self-attention with the sequence split over devices.

The function of `attention.reference_attention` (causal, sliding window,
segment ids, logit soft-cap, sinks, GQA) for queries, keys and values that
the compute rules split along the length (logical axis `length`, normally
over the `sequence` mesh axis). Where the default context parallelism
("allgather") all-gathers the keys and values so that each device attends
its L / N queries to all L keys, ring attention keeps every array split:
inside a `jax.shard_map` each of the N devices of the ring holds one chunk
of C = L / N consecutive tokens of q, k, v and the segment ids, and in N
steps the key/value chunks travel round the ring (`lax.ppermute`, device
i -> i + 1) while each device folds the chunk it holds into an online
softmax (`blockwise.online_softmax_*`), one tile of Q queries x T keys at a
time (`lax.scan`s, as in `blockwise.py`). The next chunk's transfer does
not depend on the current step's compute, so XLA may overlap them. Per
device memory is O(C) for the arrays plus one Q x T float32 logit tile (per
batch row and head): neither pass holds all L keys or an L x L matrix.

Masks use global positions: at step t device i holds the chunk of device
src = (i - t) mod N, whose tokens sit at src * C + [0, C). Tiles that the
causal mask (every chunk src > i) or the window hides completely are
skipped (`lax.cond`). The layout is contiguous, not load-balanced: device
i does i + 1 of the N causal steps, so skipping saves work but not wall
time (a zig-zag layout would balance it, at the price of re-ordering the
tokens).

Gradients: a `jax.custom_vjp` saves q, k, v, the output and the per-row
log-sum-exp (all O(C)); the backward pass runs the ring again, recomputing
each tile's probabilities, and the key/value gradients travel with their
chunk (N hops bring them home). Attention sinks start the online softmax,
so they count once per row.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import functools
import math
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from maxtext.common import axes
from maxtext.kernels import backend
from maxtext.kernels import blockwise


class _Static(NamedTuple):
  """Hashable non-array arguments of the custom-vjp function."""
  scale: float
  window: int | None
  logit_softcap: float
  axis: str | tuple[str, ...]  # Mesh axes of the ring.
  size: int  # Devices in the ring, N.
  chunk: int  # Tokens per device, C.
  block_q: int  # Queries per tile, Q (capped at C).
  block_kv: int  # Keys per tile, T (capped at C).


def _rotate(st, x):
  """`x` (a pytree) from the previous device of the ring."""
  perm = [(i, (i + 1) % st.size) for i in range(st.size)]
  return lax.ppermute(x, st.axis, perm)


def _split(x_Bc_, block):
  """[m, B, block, ...]: `x_Bc_` padded along c to a multiple of `block`
  and split (None stays None)."""
  if x_Bc_ is None:
    return None
  return blockwise.split_blocks(blockwise.pad_to(x_Bc_, 1, block), 1, block)


def _unsplit(x_mB_, chunk):
  """[B, c, ...] from blocks [m, B, block, ...] (padding dropped)."""
  x_Bm_ = jnp.moveaxis(x_mB_, 0, 1)
  return x_Bm_.reshape(x_Bm_.shape[0], -1, *x_Bm_.shape[3:])[:, :chunk]


def _forward(st, q_BcHK, k_BcGK, v_BcGK, sinks_H, seg_Bc):
  """Output [B, c, H, K] and log-sum-exp [m, B, G, R, q] (sinks included)."""
  batch, chunk, num_heads, head_dim = q_BcHK.shape
  num_kv_heads, value_dim = k_BcGK.shape[2], v_BcGK.shape[-1]
  group = num_heads // num_kv_heads
  q_mBqGRK = _split(q_BcHK.reshape(batch, chunk, num_kv_heads, group,
                                   head_dim), st.block_q)
  seg_q_mBq = _split(seg_Bc, st.block_q)
  num_q_blocks = q_mBqGRK.shape[0]
  kv = tuple(_split(x, st.block_kv) for x in (k_BcGK, v_BcGK, seg_Bc))
  num_kv_blocks = kv[0].shape[0]
  me = lax.axis_index(st.axis)

  def attend(carry_m, step, k_nBsGK, v_nBsGK, seg_k_nBs):
    """Folds the key chunk held at `step` into every query block."""
    chunk_first = (me - step) % st.size * chunk

    def query_block(_, xs):
      qi, q_BqGRK, seg_q_Bq, carry = xs
      q_first = me * chunk + qi * st.block_q

      def key_block(carry, ys):
        kj, k_BsGK, v_BsGK, seg_k_Bs = ys
        k_first = chunk_first + kj * st.block_kv

        def update(carry):
          s_BGRqs, _ = blockwise.tile_logits(st, q_BqGRK, k_BsGK)
          mask_B11qs = blockwise.tile_mask(
              st, q_first, k_first, chunk - kj * st.block_kv, seg_q_Bq,
              seg_k_Bs)[:, None, None]
          return blockwise.online_softmax_update(carry, s_BGRqs, mask_B11qs,
                                                 v_BsGK)

        needed = blockwise.tile_needed(st, q_first, k_first)
        return lax.cond(needed, update, lambda c: c, carry), None

      carry, _ = lax.scan(key_block, carry, (jnp.arange(num_kv_blocks),
                                             k_nBsGK, v_nBsGK, seg_k_nBs))
      return None, carry

    return lax.scan(query_block, None, (jnp.arange(num_q_blocks), q_mBqGRK,
                                        seg_q_mBq, carry_m))[1]

  def ring_step(state, step):
    carry_m, kv = state
    next_kv = _rotate(st, kv)  # Independent of this step's compute.
    return (attend(carry_m, step, *kv), next_kv), None

  carry_m = jax.tree.map(
      lambda x: jnp.broadcast_to(x, (num_q_blocks, *x.shape)),
      blockwise.online_softmax_init(
          (batch, num_kv_heads, group, st.block_q), value_dim, sinks_H))
  (carry_m, kv), _ = lax.scan(ring_step, (carry_m, kv),
                              jnp.arange(st.size - 1))
  carry_m = attend(carry_m, st.size - 1, *kv)
  o_mBGRqK, lse_mBGRq = blockwise.online_softmax_finish(carry_m)
  o_BcHK = _unsplit(o_mBGRqK.transpose(0, 1, 4, 2, 3, 5), chunk).reshape(
      batch, chunk, num_heads, value_dim).astype(v_BcGK.dtype)
  return o_BcHK, lse_mBGRq


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(st, q_BcHK, k_BcGK, v_BcGK, sinks_H, seg_Bc):
  return _forward(st, q_BcHK, k_BcGK, v_BcGK, sinks_H, seg_Bc)[0]


def _ring_fwd(st, q_BcHK, k_BcGK, v_BcGK, sinks_H, seg_Bc):
  o_BcHK, lse_mBGRq = _forward(st, q_BcHK, k_BcGK, v_BcGK, sinks_H, seg_Bc)
  return o_BcHK, (q_BcHK, k_BcGK, v_BcGK, sinks_H, seg_Bc, o_BcHK, lse_mBGRq)


def _ring_bwd(st, residuals, do_BcHK):
  """Gradients by a second trip round the ring (flash-attention backward
  per tile; dk and dv travel with their chunk and arrive home)."""
  q_BcHK, k_BcGK, v_BcGK, sinks_H, seg_Bc, o_BcHK, lse_mBGRq = residuals
  batch, chunk, num_heads, head_dim = q_BcHK.shape
  num_kv_heads = k_BcGK.shape[2]
  group = num_heads // num_kv_heads

  def query_blocks(x_BcHK):
    return _split(x_BcHK.reshape(batch, chunk, num_kv_heads, group,
                                 x_BcHK.shape[-1]), st.block_q)

  q_mBqGRK, do_mBqGRK = query_blocks(q_BcHK), query_blocks(do_BcHK)
  # D = rowsum(dO * O), the softmax backward's correction.
  delta_mBGRq = jnp.einsum("mbqgrk,mbqgrk->mbgrq",
                           do_mBqGRK.astype(jnp.float32),
                           query_blocks(o_BcHK).astype(jnp.float32))
  seg_q_mBq = _split(seg_Bc, st.block_q)
  num_q_blocks = q_mBqGRK.shape[0]
  kv = tuple(_split(x, st.block_kv) for x in (k_BcGK, v_BcGK, seg_Bc))
  num_kv_blocks = kv[0].shape[0]
  me = lax.axis_index(st.axis)

  def grads(dq_mBqGRK, step, k_nBsGK, v_nBsGK, seg_k_nBs, dk_nBsGK,
            dv_nBsGK):
    """Adds the gradients of the tiles of the key chunk held at `step`."""
    chunk_first = (me - step) % st.size * chunk

    def key_block(dq_mBqGRK, xs):
      kj, k_BsGK, v_BsGK, seg_k_Bs, dk_BsGK, dv_BsGK = xs
      k_first = chunk_first + kj * st.block_kv

      def query_block(carry, ys):
        qi, q_BqGRK, do_BqGRK, lse_BGRq, delta_BGRq, seg_q_Bq = ys
        q_first = me * chunk + qi * st.block_q

        def update(carry):
          dq_mBqGRK, dk_BsGK, dv_BsGK = carry
          mask_B11qs = blockwise.tile_mask(
              st, q_first, k_first, chunk - kj * st.block_kv, seg_q_Bq,
              seg_k_Bs)[:, None, None]
          dq_BqGRK, dk_BsGK, dv_BsGK = blockwise.tile_backward(
              st, q_BqGRK, k_BsGK, v_BsGK, do_BqGRK, lse_BGRq, delta_BGRq,
              mask_B11qs, dk_BsGK, dv_BsGK)
          return dq_mBqGRK.at[qi].add(dq_BqGRK), dk_BsGK, dv_BsGK

        needed = blockwise.tile_needed(st, q_first, k_first)
        return lax.cond(needed, update, lambda c: c, carry), None

      (dq_mBqGRK, dk_BsGK, dv_BsGK), _ = lax.scan(
          query_block, (dq_mBqGRK, dk_BsGK, dv_BsGK),
          (jnp.arange(num_q_blocks), q_mBqGRK, do_mBqGRK, lse_mBGRq,
           delta_mBGRq, seg_q_mBq))
      return dq_mBqGRK, (dk_BsGK, dv_BsGK)

    dq_mBqGRK, dkv = lax.scan(
        key_block, dq_mBqGRK, (jnp.arange(num_kv_blocks), k_nBsGK, v_nBsGK,
                               seg_k_nBs, dk_nBsGK, dv_nBsGK))
    return dq_mBqGRK, dkv

  def ring_step(state, step):
    dq_mBqGRK, kv, dkv = state
    next_kv = _rotate(st, kv)
    dq_mBqGRK, dkv = grads(dq_mBqGRK, step, *kv, *dkv)
    return (dq_mBqGRK, next_kv, _rotate(st, dkv)), None

  zeros = functools.partial(jnp.zeros, dtype=jnp.float32)
  (dq_mBqGRK, kv, dkv), _ = lax.scan(
      ring_step, (zeros(q_mBqGRK.shape), kv,
                  (zeros(kv[0].shape), zeros(kv[1].shape))),
      jnp.arange(st.size - 1))
  dq_mBqGRK, dkv = grads(dq_mBqGRK, st.size - 1, *kv, *dkv)
  dk_nBsGK, dv_nBsGK = _rotate(st, dkv)  # The last hop home.
  dsinks_H = None
  if sinks_H is not None:
    # The sink is a key with value 0: d sink = -sum_rows p_sink * D.
    sinks_11GR1 = sinks_H.astype(jnp.float32).reshape(1, 1, num_kv_heads,
                                                      group, 1)
    p_sink_mBGRq = jnp.exp(sinks_11GR1 - lse_mBGRq)
    dsinks_H = -(p_sink_mBGRq * delta_mBGRq).sum((0, 1, 4)).reshape(
        num_heads).astype(sinks_H.dtype)
  dq_BcHK = _unsplit(dq_mBqGRK, chunk).reshape(q_BcHK.shape)
  return (dq_BcHK.astype(q_BcHK.dtype),
          _unsplit(dk_nBsGK, chunk).astype(k_BcGK.dtype),
          _unsplit(dv_nBsGK, chunk).astype(v_BcGK.dtype), dsinks_H, None)


_ring.defvjp(_ring_fwd, _ring_bwd)


def _axes_of(entry) -> tuple[str, ...]:
  """The mesh axes of one `PartitionSpec` entry."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def context_axes(length: int) -> tuple[str, ...]:
  """The mesh axes that split a query length of `length` under the
  activation sharding in effect: the ring of `ring_attention` (() when
  there is no activation mesh or the length is not split)."""
  if backend.single_device():
    return ()
  spec = axes.current_constrainer().compute_spec((axes.LENGTH,), (length,))
  return _axes_of(spec[0])


def ring_attention(
    q_BLHK: jax.Array,
    k_BLGK: jax.Array,
    v_BLGK: jax.Array,
    *,
    scale: float,
    window: int | None = None,
    segment_ids_BL: jax.Array | None = None,
    logit_softcap: float = 0.0,
    sinks_H: jax.Array | None = None,
    block_q: int = 512,
    block_kv: int = 512,
) -> jax.Array:
  """Causal self-attention as `attention.reference_attention`, computed
  round a ring of the devices that split the length (see module docstring).

  Runs in a `jax.shard_map` over the mesh of the activation sharding in
  effect (`axes.activation_sharding`): the batch, length and heads split as
  the compute rules split them for the queries (keys and values are split
  along the length like the queries, logical axis `length`, never
  `kv_length`).

  Args:
    q_BLHK: Queries.
    k_BLGK: Keys (self-attention: same length as the queries).
    v_BLGK: Values.
    scale: Multiplier of the query-key dot products.
    window: A query sees this many keys, itself included; None: no window.
    segment_ids_BL: Tokens attend only to tokens with the same id.
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    sinks_H: Per-query-head sink logit (scaled-logit units); None: none.
    block_q: Queries per tile (capped at the chunk, L / N).
    block_kv: Keys per tile (capped at the chunk).

  Returns:
    Attention output [B, L, H, K] in the dtype of `v_BLGK`.

  Raises:
    ValueError: a block size is not positive; no activation sharding
      splits the length; the keys' length differs from the queries'; or the
      compute rules split the head dim, or the batch or heads of queries
      and keys differently.
  """
  for name, value in (("block_q", block_q), ("block_kv", block_kv)):
    if value < 1:
      raise ValueError(f"ring_attention: {name}={value} must be a positive "
                       "integer.")
  length = q_BLHK.shape[1]
  if k_BLGK.shape[1] != length or v_BLGK.shape[1] != length:
    raise ValueError(
        f"ring_attention is self-attention: keys {k_BLGK.shape} and values "
        f"{v_BLGK.shape} must have the queries' length {length}.")
  ring_axes = context_axes(length)
  if not ring_axes:
    raise ValueError(
        "ring_attention needs an activation sharding "
        "(axes.activation_sharding) whose compute rules split the length "
        f"{length} over a mesh axis (e.g. 'sequence' > 1).")
  constrainer = axes.current_constrainer()
  mesh = constrainer.mesh

  def spec(x, heads):
    return constrainer.compute_spec(
        (axes.BATCH, axes.LENGTH, heads, axes.HEAD_DIM), x.shape)

  q_spec = spec(q_BLHK, axes.HEADS)
  k_spec, v_spec = spec(k_BLGK, axes.KV_HEADS), spec(v_BLGK, axes.KV_HEADS)
  if (q_spec[3] is not None or v_spec[3] is not None or
      not q_spec[:3] == k_spec[:3] == v_spec[:3]):
    raise ValueError(
        f"ring_attention splits queries, keys and values alike; the compute "
        f"rules give queries {q_spec}, keys {k_spec} and values {v_spec} "
        "(batch, length and heads must split alike, the head dim not at "
        "all: e.g. num_kv_heads must be a multiple of the tensor axis).")
  size = math.prod(mesh.shape[a] for a in ring_axes)
  st = _Static(scale=float(scale), window=window,
               logit_softcap=float(logit_softcap),
               axis=ring_axes[0] if len(ring_axes) == 1 else ring_axes,
               size=size, chunk=length // size,
               block_q=min(block_q, length // size),
               block_kv=min(block_kv, length // size))
  row_spec = P(q_spec[0], q_spec[1])
  return jax.shard_map(
      functools.partial(_ring, st), mesh=mesh,
      in_specs=(q_spec, k_spec, v_spec,
                None if sinks_H is None else P(q_spec[2]),
                None if segment_ids_BL is None else row_spec),
      out_specs=q_spec, check_vma=False)(q_BLHK, k_BLGK, v_BLGK, sinks_H,
                                         segment_ids_BL)
