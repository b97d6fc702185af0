"""Tests of paged decode attention: the reference and the plain-JAX scan
equal a numpy softmax over each sequence's own keys, across lengths, page
sizes, GQA, windows, chunks, soft-cap and sinks; the TPU kernel compiles
for v5e."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.aot import topology
from maxtext.common import axes
from maxtext.kernels import paged_attention
from maxtext.sharding import rules
from testing import trees

_K = 8


def _paged_cache(lengths, page_size, pages_per_seq, num_heads, num_kv_heads,
                 seed=0):
  """Random per-sequence keys/values scattered over shuffled pages."""
  rng = np.random.RandomState(seed)
  batch = len(lengths)
  dense = pages_per_seq * page_size
  k = rng.normal(size=(batch, dense, num_kv_heads, _K)).astype(np.float32)
  v = rng.normal(size=(batch, dense, num_kv_heads, _K)).astype(np.float32)
  q = rng.normal(size=(batch, num_heads, _K)).astype(np.float32)
  num_pages = batch * pages_per_seq + 3  # Some pages belong to nobody.
  page_table = rng.permutation(num_pages)[:batch * pages_per_seq].reshape(
      batch, pages_per_seq).astype(np.int32)
  k_pages = rng.normal(size=(num_pages, page_size, num_kv_heads, _K)).astype(
      np.float32)
  v_pages = k_pages.copy()
  for b in range(batch):
    for n in range(pages_per_seq):
      rows = slice(n * page_size, (n + 1) * page_size)
      k_pages[page_table[b, n]] = k[b, rows]
      v_pages[page_table[b, n]] = v[b, rows]
  return q, k, v, k_pages, v_pages, page_table


def _numpy_decode(q, k, v, lengths, scale, window, softcap, sinks,
                  chunk=None):
  """Each sequence's query over its own first `length` keys (the last
  `window` of them, or those of its chunk)."""
  group = q.shape[1] // k.shape[2]
  out = np.zeros(q.shape[:2] + (v.shape[-1],), np.float64)
  for b, length in enumerate(lengths):
    first = 0 if window is None else max(0, length - window)
    if chunk is not None:
      first = (length - 1) // chunk * chunk
    for h in range(q.shape[1]):
      keys = k[b, first:length, h // group]
      logits = keys @ q[b, h] * scale
      if softcap:
        logits = softcap * np.tanh(logits / softcap)
      if sinks is not None:
        logits = np.append(logits, sinks[h])
      probs = np.exp(logits - logits.max())
      probs = (probs / probs.sum())[:length - first]
      out[b, h] = probs @ v[b, first:length, h // group]
  return out


class PagedAttentionTest(parameterized.TestCase):

  @parameterized.product(
      impl=("reference", "jax"),
      setup=(
          dict(page_size=4, pages_per_seq=5, heads=(4, 4),
               lengths=(1, 4, 5, 20)),
          dict(page_size=8, pages_per_seq=3, heads=(4, 2),
               lengths=(17, 3, 9)),
          dict(page_size=16, pages_per_seq=2, heads=(4, 1),
               lengths=(32, 6)),
      ),
      features=(dict(), dict(window=6, softcap=2.0, sinks=True),
                dict(chunk=6)),
  )
  def test_matches_numpy(self, impl, setup, features):
    num_heads, num_kv_heads = setup["heads"]
    lengths = np.int32(setup["lengths"])
    q, k, v, k_pages, v_pages, page_table = _paged_cache(
        lengths, setup["page_size"], setup["pages_per_seq"], num_heads,
        num_kv_heads)
    window, chunk = features.get("window"), features.get("chunk")
    softcap = features.get("softcap", 0.0)
    sinks = (np.linspace(-1.0, 1.0, num_heads).astype(np.float32)
             if features.get("sinks") else None)
    got = paged_attention.paged_attention(
        q, k_pages, v_pages, page_table, lengths, scale=0.5, window=window,
        chunk=chunk, logit_softcap=softcap, sinks_H=sinks, impl=impl)
    want = _numpy_decode(q, k, v, lengths, 0.5, window, softcap, sinks,
                         chunk)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_jax_gradients_match_reference(self):
    lengths = np.int32([7, 12])
    q, _, _, k_pages, v_pages, page_table = _paged_cache(lengths, 4, 3, 4, 2)
    sinks = np.float32([0.5, 0.0, -0.5, 1.0])

    def grads(impl):
      def loss(q, k_pages, v_pages, sinks):
        return (paged_attention.paged_attention(
            q, k_pages, v_pages, page_table, lengths, scale=0.5,
            logit_softcap=3.0, sinks_H=sinks, impl=impl) ** 2).sum()
      return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k_pages, v_pages, sinks)

    for got, want in zip(grads("jax"), grads("reference")):
      trees.assert_close(got, want, rtol=1e-4, scaled_atol=1e-4)

  def test_pallas_needs_tpu_and_no_window(self):
    q, _, _, k_pages, v_pages, page_table = _paged_cache([3], 4, 1, 2, 2)
    with self.assertRaisesRegex(ValueError, "'pallas' runs on TPU.*'jax'"):
      paged_attention.paged_attention(q, k_pages, v_pages, page_table,
                                      np.int32([3]), scale=1.0,
                                      impl="pallas")

  # Float32 pages take the plain-JAX scan: Mosaic cannot compile the
  # kernel's float32 matmuls on a v5e ("Bad rhs type", tools/tpu).
  @parameterized.named_parameters(("bfloat16", jnp.bfloat16, True),
                                  ("float32", jnp.float32, False))
  def test_auto_compiles_to_the_tpu_kernel(self, page_dtype, kernel):
    hardware = topology.hardware_for("v5e-1")
    mesh = jax.sharding.Mesh(np.array(hardware.devices), ("data",))
    sharding = jax.sharding.SingleDeviceSharding(hardware.devices[0])

    def spec(shape, dtype=page_dtype):
      return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    def decode(q, k_pages, v_pages, page_table, lengths):
      with axes.activation_sharding(rules.LogicalRules(mesh, (), ())):
        return paged_attention.paged_attention(
            q, k_pages, v_pages, page_table, lengths, scale=0.1,
            logit_softcap=30.0, pages_per_compute_block=4)

    compiled = jax.jit(decode).lower(
        spec((4, 8, 128)), spec((64, 16, 2, 128)), spec((64, 16, 2, 128)),
        spec((4, 16), jnp.int32), spec((4,), jnp.int32)).compile()
    self.assertEqual("custom_call_target=\"tpu_custom_call\"" in
                     compiled.as_text(), kernel)


if __name__ == "__main__":
  absltest.main()
