"""DeepSeek Sparse Attention against a numpy reference: multi-head latent
attention with the expanded per-head keys and values over a dense mask of
the tokens that numpy's own top-k of the published index score selects.
Across block sizes, lengths that blocks do not divide, top_k above the
allowed count, packed segments, a decoding cache with empty slots, and the
gradients; the indexer's KL loss of both training stages against numpy's
formula (dense warm-up: over every allowed token; sparse: over the
selected), its gradients reaching the indexer only; and the compiled memory
grows linearly with the length at a fixed top_k."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.kernels import sparse_attention
from testing import trees

_H, _O, _K, _Z, _U, _I, _J = 3, 4, 2, 6, 5, 2, 4
_SCALE, _INDEX_SCALE = 0.3, 0.5


def _inputs(batch, length, cache=None, seed=0):
  rng = np.random.default_rng(seed)
  keys = cache or length

  def normal(*shape):
    return rng.normal(size=shape).astype(np.float32)

  # Positive indexer queries and keys: no relu zeros, so no tied scores.
  return dict(
      q_nope=normal(batch, length, _H, _O), qr=normal(batch, length, _H, _K),
      c=normal(batch, keys, _Z), r=normal(batch, keys, _K),
      iq=np.abs(normal(batch, length, _I, _J)),
      ik=np.abs(normal(batch, keys, _J)), w=normal(batch, length, _I),
      w_uk=normal(_H, _O, _Z), w_uv=normal(_H, _U, _Z))


def _numpy_reference(x, top_k, q_pos, k_pos, q_seg, k_seg):
  """Expanded MLA over the numpy-selected tokens: [B, L, H, U]."""
  index = np.einsum("bli,blis->bls", x["w"], np.maximum(np.einsum(
      "blij,bsj->blis", x["iq"], x["ik"]) * _INDEX_SCALE, 0))
  allowed = ((k_pos[:, None, :] <= q_pos[:, :, None]) &
             (k_pos[:, None, :] >= 0) &
             (q_seg[:, :, None] == k_seg[:, None, :]))
  index = np.where(allowed, index, -np.inf)
  chosen = np.zeros_like(allowed)
  order = np.argsort(-index, axis=-1, kind="stable")[..., :top_k]
  np.put_along_axis(chosen, order, True, axis=-1)
  chosen &= allowed
  k_nope = np.einsum("hoz,bsz->bsho", x["w_uk"], x["c"])
  values = np.einsum("huz,bsz->bshu", x["w_uv"], x["c"])
  logits = _SCALE * (np.einsum("blho,bsho->blhs", x["q_nope"], k_nope) +
                     np.einsum("blhk,bsk->blhs", x["qr"], x["r"]))
  logits = np.where(chosen[:, :, None], logits, -np.inf)
  has_any = chosen.any(-1)[:, :, None, None]
  logits = np.where(has_any, logits, 0.0)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs = np.where(has_any, probs / probs.sum(-1, keepdims=True), 0.0)
  return np.einsum("blhs,bshu->blhu", probs, values)


def _numpy_kl(x, top_k, q_pos, k_pos, q_seg, k_seg, dense):
  """The published indexer loss per query [B, L]: KL from the heads'
  summed, L1-normalised attention over the attended tokens (all allowed
  with `dense`, else numpy's top-k) to the softmax of the index scores over
  the same tokens."""
  index = np.einsum("bli,blis->bls", x["w"], np.maximum(np.einsum(
      "blij,bsj->blis", x["iq"], x["ik"]) * _INDEX_SCALE, 0))
  attended = ((k_pos[:, None, :] <= q_pos[:, :, None]) &
              (k_pos[:, None, :] >= 0) &
              (q_seg[:, :, None] == k_seg[:, None, :]))
  if not dense:
    order = np.argsort(-np.where(attended, index, -np.inf), axis=-1,
                       kind="stable")[..., :top_k]
    chosen = np.zeros_like(attended)
    np.put_along_axis(chosen, order, True, axis=-1)
    attended &= chosen
  k_nope = np.einsum("hoz,bsz->bsho", x["w_uk"], x["c"])
  logits = _SCALE * (np.einsum("blho,bsho->blhs", x["q_nope"], k_nope) +
                     np.einsum("blhk,bsk->blhs", x["qr"], x["r"]))
  kl = np.zeros(attended.shape[:2])
  for b, t in np.ndindex(*kl.shape):
    keys = attended[b, t]
    if not keys.any():
      continue
    head_logits = logits[b, t][:, keys].astype(np.float64)
    probs = np.exp(head_logits - head_logits.max(-1, keepdims=True))
    target = (probs / probs.sum(-1, keepdims=True)).sum(0)
    target /= target.sum()
    scores = index[b, t, keys].astype(np.float64)
    log_q = scores - scores.max() - np.log(np.exp(scores - scores.max()).sum())
    kl[b, t] = np.sum(target * (np.log(target) - log_q))
  return kl


def _ours(x, top_k, q_pos, k_pos, q_seg=None, k_seg=None, block=64,
          **kwargs):
  qc = jnp.einsum("blho,hoz->blhz", x["q_nope"], x["w_uk"])
  out = sparse_attention.sparse_attention(
      qc, x["qr"], x["c"], x["r"], x["iq"], x["ik"], x["w"], top_k=top_k,
      scale=_SCALE, index_scale=_INDEX_SCALE, q_positions_BL=q_pos,
      k_positions_BS=k_pos, q_segments_BL=q_seg, k_segments_BS=k_seg,
      block=block, **kwargs)
  if kwargs.get("index_loss"):
    latent, kl = out
    return jnp.einsum("blhz,huz->blhu", latent, x["w_uv"]), kl
  return jnp.einsum("blhz,huz->blhu", out, x["w_uv"])


def _arange(batch, length):
  return np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))


class SparseAttentionTest(parameterized.TestCase):

  @parameterized.parameters((37, 5, 8), (37, 5, 64), (40, 16, 16),
                            (9, 64, 4), (1, 3, 8))
  def test_causal_equals_numpy(self, length, top_k, block):
    x = _inputs(2, length)
    pos = _arange(2, length)
    zeros = np.zeros((2, length), np.int32)
    want = _numpy_reference(x, top_k, pos, pos, zeros, zeros)
    got = _ours(x, top_k, pos, pos, block=block)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_packed_segments_select_within_their_own(self):
    length, top_k = 30, 6
    x = _inputs(2, length, seed=1)
    segments = np.repeat(np.array([[0, 1, 2], [5, 5, 6]], np.int32), 10,
                         axis=1)
    pos = _arange(2, length)
    want = _numpy_reference(x, top_k, pos, pos, segments, segments)
    got = _ours(x, top_k, pos, pos, segments, segments, block=8)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_decoding_over_a_cache_with_empty_slots(self):
    """Two queries at positions 11, 12 of row 0 and 4, 5 of row 1 over a
    16-slot cache (slots past each row's tokens empty: position -1)."""
    x = _inputs(2, 2, cache=16, seed=2)
    q_pos = np.array([[11, 12], [4, 5]], np.int32)
    k_pos = _arange(2, 16).copy()
    k_pos[1, 6:] = -1
    zeros_q, zeros_k = (np.zeros((2, n), np.int32) for n in (2, 16))
    want = _numpy_reference(x, 4, q_pos, k_pos, zeros_q, zeros_k)
    got = _ours(x, 4, q_pos, k_pos)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_gradients_equal_dense_masked_attention(self):
    """Through the selected tokens the gradients are those of expanded
    attention masked to the same selection (jnp, same float32)."""
    length, top_k = 21, 4
    x = {k: jnp.asarray(v) for k, v in _inputs(1, length, seed=3).items()}
    pos = _arange(1, length)
    index = sparse_attention.index_scores(x["iq"], x["ik"], x["w"],
                                          index_scale=_INDEX_SCALE)
    chosen_index, valid = sparse_attention.select(
        index, sparse_attention.allowed(pos, pos), top_k)
    chosen = jax.vmap(jax.vmap(lambda i, v: jnp.zeros(
        length, bool).at[i].max(v)))(chosen_index, valid)
    cotangent = jax.random.normal(jax.random.key(0), (1, length, _H, _U))

    def dense(q_nope, qr, c, r):
      k_nope = jnp.einsum("hoz,bsz->bsho", x["w_uk"], c)
      values = jnp.einsum("huz,bsz->bshu", x["w_uv"], c)
      logits = _SCALE * (jnp.einsum("blho,bsho->blhs", q_nope, k_nope) +
                         jnp.einsum("blhk,bsk->blhs", qr, r))
      probs = jax.nn.softmax(jnp.where(chosen[:, :, None], logits, -1e30))
      return jnp.sum(jnp.einsum("blhs,bshu->blhu", probs, values) *
                     cotangent)

    def ours(q_nope, qr, c, r):
      return jnp.sum(_ours(dict(x, q_nope=q_nope, qr=qr, c=c, r=r), top_k,
                           pos, pos, block=8) * cotangent)

    args = (x["q_nope"], x["qr"], x["c"], x["r"])
    for got, want in zip(jax.grad(ours, argnums=(0, 1, 2, 3))(*args),
                         jax.grad(dense, argnums=(0, 1, 2, 3))(*args)):
      trees.assert_close(got, want, rtol=1e-4, scaled_atol=1e-4)

  @parameterized.parameters((False, 37, 5, 8), (True, 37, 5, 8),
                            (False, 9, 64, 4), (True, 20, 3, 64))
  def test_indexer_kl_equals_numpy(self, dense, length, top_k, block):
    """Both stages' loss per query (packed segments: the KL stays within
    each query's own), and the attention output unchanged by computing it:
    the warm-up's dense attention equals the reference over every allowed
    token."""
    x = _inputs(2, length, seed=4)
    pos = _arange(2, length)
    segments = np.repeat(np.array([[1, 2], [3, 3]], np.int32), length,
                         axis=1)[:, :length * 2:2]
    got_out, got_kl = _ours(x, top_k, pos, pos, segments, segments,
                            block=block, dense=dense, index_loss=True)
    # KL of softmaxes over up to 37 keys, summed over heads: within 1e-4
    # of the largest.
    trees.assert_close(
        got_kl, _numpy_kl(x, top_k, pos, pos, segments, segments, dense),
        rtol=1e-4, scaled_atol=1e-4)
    want_out = _numpy_reference(x, length if dense else top_k, pos, pos,
                                segments, segments)
    trees.assert_close(got_out, want_out, rtol=1e-5, scaled_atol=1e-5)

  @parameterized.parameters(False, True)
  def test_indexer_kl_trains_the_indexer_only(self, dense):
    """The KL's gradients reach the indexer's queries, keys and weights and
    leave the attention's inputs alone (its distribution is a target); a
    few gradient steps on the indexer lower it."""
    length = 24
    x = {k: jnp.asarray(v) for k, v in _inputs(1, length, seed=5).items()}
    pos = _arange(1, length)

    def kl(x):
      return jnp.mean(_ours(x, 4, pos, pos, block=8, dense=dense,
                            index_loss=True)[1])

    loss_and_grads = jax.jit(jax.value_and_grad(kl))
    first, grads = loss_and_grads(x)
    for name in ("q_nope", "qr", "c", "r", "w_uk", "w_uv"):
      self.assertEqual(float(jnp.abs(grads[name]).max()), 0.0, name)
    for name in ("iq", "ik", "w"):
      self.assertGreater(float(jnp.abs(grads[name]).max()), 0.0, name)
    for _ in range(20):
      x = {k: v - 0.5 * grads[k] if k in ("iq", "ik", "w") else v
           for k, v in x.items()}
      last, grads = loss_and_grads(x)
    self.assertLess(float(last), 0.7 * float(first))

  def test_memory_grows_linearly_with_length(self):
    """XLA's compiled scratch memory at fixed top_k and block: doubling the
    length from 1024 to 2048 at most (about) doubles it, where one L x S
    score matrix would quadruple."""
    def scratch(length):
      x = _inputs(1, length)
      pos = _arange(1, length)
      return jax.jit(lambda x: _ours(x, 16, pos, pos)).lower(
          x).compile().memory_analysis().temp_size_in_bytes

    small, large = scratch(1024), scratch(2048)
    print(f"scratch bytes: L=1024 {small:,}, L=2048 {large:,}")
    self.assertLess(large, 2.5 * small)


if __name__ == "__main__":
  absltest.main()
