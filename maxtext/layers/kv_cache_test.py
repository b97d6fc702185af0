"""Tests the paged KV cache against the dense one.

Rows written through a shuffled page table (a prompt, then one token per
row at different positions) read back exactly what `KVCache` holds; the
layers' cache state is only pages (the page table is the caller's, one for
every layer); a paged cache without a table, or a table without one, is
refused by name.
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.layers import kv_cache

_BATCH, _PAGES_PER_ROW, _PAGE_SIZE, _HEADS, _HEAD_DIM = 2, 3, 4, 2, 5
_LENGTH = _PAGES_PER_ROW * _PAGE_SIZE


def _entries(seed: int, length: int) -> jax.Array:
  return jnp.asarray(np.random.RandomState(seed).normal(
      size=(_BATCH, length, _HEADS, _HEAD_DIM)), jnp.float32)


class PagedKVCacheTest(absltest.TestCase):

  def test_paged_view_reads_what_the_dense_cache_holds(self):
    num_pages = _BATCH * _PAGES_PER_ROW + 1  # Page 0 left unused.
    table_BN = jnp.asarray(1 + np.random.RandomState(0).permutation(
        _BATCH * _PAGES_PER_ROW).reshape(_BATCH, _PAGES_PER_ROW))
    dense = kv_cache.KVCache.zeros(_BATCH, _LENGTH, _HEADS, _HEAD_DIM,
                                   jnp.float32)
    (paged,) = kv_cache.paged_like(
        (dense,), num_pages=num_pages, page_size=_PAGE_SIZE)
    view = kv_cache.PagedView(paged, table_BN)
    self.assertEqual(view.length, _LENGTH)
    # A 5-token prompt from 0 (it crosses a page), then a token per row at
    # positions 5 and 8 (the first slot of the last page).
    writes = ((_entries(0, 5), _entries(1, 5), jnp.array([0, 0])),
              (_entries(2, 1), _entries(3, 1), jnp.array([5, 8])))
    for k_BLGK, v_BLGK, start_B in writes:
      dense = dense.write(k_BLGK, v_BLGK, start_B)
      view = view.write(k_BLGK, v_BLGK, start_B)
    key_BSGK, value_BSGK = view.gather()
    np.testing.assert_array_equal(key_BSGK, dense.key_BSGK)
    np.testing.assert_array_equal(value_BSGK, dense.value_BSGK)

  def test_cache_state_is_pages_only(self):
    # Three stacked layers, as `Decoder.init_cache` gives with scan_layers.
    layers = jax.eval_shape(lambda: jax.vmap(
        lambda _: kv_cache.KVCache.zeros(_BATCH, 1, _HEADS, _HEAD_DIM,
                                         jnp.bfloat16))(jnp.arange(3)))
    paged = kv_cache.paged_like(layers, num_pages=7, page_size=_PAGE_SIZE)
    self.assertEqual(
        [(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(paged)],
        [((3, 7, _PAGE_SIZE, _HEADS, _HEAD_DIM), jnp.bfloat16)] * 2)

  def test_page_table_goes_with_a_paged_cache_only(self):
    dense = kv_cache.KVCache.zeros(_BATCH, 1, _HEADS, _HEAD_DIM, jnp.float32)
    paged = kv_cache.paged_like((dense,), num_pages=3, page_size=_PAGE_SIZE)
    table_BN = jnp.zeros((_BATCH, _PAGES_PER_ROW), jnp.int32)
    kv_cache.check_page_table(paged, table_BN)
    kv_cache.check_page_table((dense,), None)
    kv_cache.check_page_table(None, None)
    for cache, table, message in (
        (paged, None, "got a paged cache and page_table_BN=None"),
        ((dense,), table_BN, "got a dense cache and page_table_BN=an array"),
        (None, table_BN, "got no cache and page_table_BN=an array")):
      with self.assertRaisesRegex(ValueError, message):
        kv_cache.check_page_table(cache, table)


if __name__ == "__main__":
  absltest.main()
