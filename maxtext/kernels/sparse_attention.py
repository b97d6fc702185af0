"""DeepSeek Sparse Attention (DeepSeek-V3.2): the lightning indexer's top-k
selection and latent attention over the selected tokens only.

The indexer scores every allowed key position s for query t with its own I
heads, queries iq[t, i] (width J) and one key ik[s] shared by its heads:

  I[t, s] = sum_i w[t, i] * relu(index_scale * iq[t, i] . ik[s]),

and each query keeps the `top_k` allowed positions of highest score (all of
them when fewer are allowed). Allowed: the key's position is at or before
the query's (`positions`), within the query's segment when segments are
given; a key slot of position -1 is empty (an unwritten cache slot).

Attention then runs over the selected tokens only, in multi-head latent
attention's absorbed form (DeepSeek's inference code): each token's key and
value come from its latent c[s] (width Z) and rotary key r[s] (width K),
shared by every head, so a query head's logit over selected token s_j is

  scale * (qc[t, h] . c[s_j] + qr[t, h] . r[s_j]),

where qc is the non-rotary query with the key up-projection absorbed
(qc = W_uk q_nope, the caller's), and its output softmax . c[s_j] is in latent
space (the caller applies the value up-projection). This equals MLA over the
same tokens with the expanded keys and values.

The indexer trains through its own loss (DeepSeek-V3.2's paper), never
through the selection: with `index_loss` each query also returns the KL
divergence from the main attention's distribution over its keys (the
heads' attention probabilities summed and L1-normalised, held constant) to
the indexer's (softmax of its scores over the same keys), sum_s
p[s] (log p[s] - log softmax(I)[s]). Over the selected tokens in the sparse
stage; with `dense` (the dense warm-up stage) every allowed key is attended
to, as dense MLA does, and the KL covers them all.

Queries are processed `block` at a time (`lax.map`), so the index scores
take [block, S] and the gathered tokens [block, top_k, Z + K] per step
(recomputed, not kept, for the backward pass): memory grows linearly with
the length at a fixed top_k, never with an L x S attention matrix (with
`dense`, [block, H, S] probabilities per step). All arithmetic is float32.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY` (I indexer heads, J their
width, Z latent width, j selected tokens).
"""

import jax
import jax.numpy as jnp
from jax.scipy import special


def index_scores(iq_BLIJ: jax.Array, ik_BSJ: jax.Array, w_BLI: jax.Array, *,
                 index_scale: float) -> jax.Array:
  """I[b, t, s] of the module docstring: [B, L, S], float32."""
  relu_BLIS = jax.nn.relu(jnp.einsum(
      "blij,bsj->blis", iq_BLIJ.astype(jnp.float32),
      ik_BSJ.astype(jnp.float32)) * index_scale)
  return jnp.einsum("bli,blis->bls", w_BLI.astype(jnp.float32), relu_BLIS)


def allowed(q_positions_BL: jax.Array, k_positions_BS: jax.Array,
            q_segments_BL: jax.Array | None = None,
            k_segments_BS: jax.Array | None = None) -> jax.Array:
  """[B, L, S]: key s is at or before query t (and in its segment), and its
  slot is written (position >= 0)."""
  k_BS = k_positions_BS[:, None, :]
  mask_BLS = (k_BS <= q_positions_BL[:, :, None]) & (k_BS >= 0)
  if q_segments_BL is not None:
    mask_BLS &= q_segments_BL[:, :, None] == k_segments_BS[:, None, :]
  return mask_BLS


def select(scores_BLS: jax.Array, allowed_BLS: jax.Array,
           top_k: int) -> tuple[jax.Array, jax.Array]:
  """(positions [B, L, j], valid [B, L, j]) of the `top_k` allowed keys of
  highest score per query (j = min(top_k, S)); invalid slots past the
  allowed count."""
  masked_BLS = jnp.where(allowed_BLS, scores_BLS, -jnp.inf)
  values_BLj, index_BLj = jax.lax.top_k(jax.lax.stop_gradient(masked_BLS),
                                        min(top_k, scores_BLS.shape[-1]))
  return index_BLj, values_BLj > -jnp.inf


def _gather(x_BSx: jax.Array, index_BLj: jax.Array) -> jax.Array:
  """x at each query's selected positions: [B, L, j, ...]."""
  return jax.vmap(lambda x, i: x[i])(x_BSx, index_BLj)


def _attend(qc_BLHZ: jax.Array, qr_BLHK: jax.Array, c: jax.Array,
            r: jax.Array, valid: jax.Array, *, scale: float,
            tokens: str) -> tuple[jax.Array, jax.Array]:
  """(Latent-space output [B, L, H, Z], probabilities [B, L, H, n]) of
  each query over n tokens: each query's own (c [B, L, n, Z], r [.., K],
  `tokens` "lj") or every query's (c [B, n, Z], r [B, n, K], `tokens`
  ""), of which `valid` [B, L, n] are attended to."""
  c = c.astype(jnp.float32)
  spec = f"b{tokens or 'j'}"
  logits_BLHn = scale * (
      jnp.einsum(f"blhz,{spec}z->blhj", qc_BLHZ.astype(jnp.float32), c) +
      jnp.einsum(f"blhk,{spec}k->blhj", qr_BLHK.astype(jnp.float32),
                 r.astype(jnp.float32)))
  # A finite floor, and no weight on invalid slots: a query with none
  # (a padding query) outputs zeros, and no NaN reaches the gradients.
  valid_BL1n = valid[:, :, None]
  probs_BLHn = jax.nn.softmax(jnp.where(valid_BL1n, logits_BLHn, -1e30),
                              axis=-1) * valid_BL1n
  return jnp.einsum(f"blhj,{spec}z->blhz", probs_BLHn, c), probs_BLHn


def indexer_kl(target_BLn: jax.Array, scores_BLn: jax.Array,
               valid_BLn: jax.Array) -> jax.Array:
  """KL(target || softmax of the scores over the valid tokens) per query,
  [B, L] (module docstring); `target_BLn` sums to 1 over each query's
  valid tokens (0 for a query with none, whose KL is 0)."""
  log_q_BLn = jax.nn.log_softmax(
      jnp.where(valid_BLn, scores_BLn, -1e30), axis=-1)
  return jnp.sum(jnp.where(valid_BLn, special.xlogy(target_BLn, target_BLn)
                           - target_BLn * log_q_BLn, 0.0), axis=-1)


def sparse_attention(
    qc_BLHZ: jax.Array, qr_BLHK: jax.Array, c_BSZ: jax.Array,
    r_BSK: jax.Array, iq_BLIJ: jax.Array, ik_BSJ: jax.Array,
    w_BLI: jax.Array, *, top_k: int, scale: float, index_scale: float,
    q_positions_BL: jax.Array, k_positions_BS: jax.Array,
    q_segments_BL: jax.Array | None = None,
    k_segments_BS: jax.Array | None = None, block: int = 64,
    dense: bool = False, index_loss: bool = False
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """The module docstring's attention, `block` queries at a time: its
  latent-space output [B, L, H, Z], float32; with `index_loss`, (that
  output, each query's indexer KL [B, L]). `dense`: every allowed token is
  attended to (the warm-up stage; `top_k` unused)."""
  batch, length = qc_BLHZ.shape[:2]
  block = min(block, length)
  pad = -length % block
  if q_segments_BL is None:
    q_segments_BL = jnp.zeros((batch, length), jnp.int32)
    k_segments_BS = jnp.zeros(c_BSZ.shape[:2], jnp.int32)
  per_query = (qc_BLHZ, qr_BLHK, iq_BLIJ, w_BLI, q_positions_BL,
               q_segments_BL)

  def blocks(x):  # [B, L, ...] -> [n, B, block, ...]; padding: position -1.
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2),
                constant_values=-1 if jnp.issubdtype(x.dtype, jnp.integer)
                else 0)
    return jnp.moveaxis(x.reshape(batch, -1, block, *x.shape[2:]), 1, 0)

  def one_block(args):
    qc, qr, iq, w, q_positions, q_segments = args
    valid = allowed(q_positions, k_positions_BS, q_segments, k_segments_BS)
    scores = (index_scores(iq, ik_BSJ, w, index_scale=index_scale)
              if index_loss or not dense else None)
    if dense:
      out, probs = _attend(qc, qr, c_BSZ, r_BSK, valid, scale=scale,
                           tokens="")
    else:
      index, valid = select(scores, valid, top_k)
      out, probs = _attend(qc, qr, _gather(c_BSZ, index),
                           _gather(r_BSK, index), valid, scale=scale,
                           tokens="lj")
      scores = jnp.take_along_axis(scores, index, axis=-1)
    if not index_loss:
      return out
    # The heads' distributions, summed and L1-normalised: a target only.
    target = jax.lax.stop_gradient(probs.sum(2) / jnp.maximum(
        probs.sum((2, 3))[..., None], 1e-30))
    return out, indexer_kl(target, scores, valid)

  # Rematerialised: the backward pass recomputes one block's gathered
  # tokens at a time instead of keeping every block's [block, j, Z + K].
  outputs = jax.lax.map(jax.checkpoint(one_block),
                        tuple(map(blocks, per_query)))

  def unblock(x_nBb):
    x_BLx = jnp.moveaxis(x_nBb, 0, 1).reshape(batch, length + pad,
                                              *x_nBb.shape[3:])
    return x_BLx[:, :length]

  return jax.tree.map(unblock, outputs)
