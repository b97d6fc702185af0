"""Key/value cache of one attention layer, for decoding token by token.

`KVCache`, a full-length cache: slot j holds the key and value of position
j, for positions 0..S-1 of every row. Sliding-window layers keep the full
cache and mask keys outside the window
(`maxtext.kernels.attention.positions_mask`). Rows may be at different
positions (batched prompts of different lengths): each row writes its new
keys at its own position.

`PagedKVCache`, a paged cache: a pool of fixed-size pages shared by the
rows, so a row holds memory for the positions it reached rather than for
the longest possible sequence (`paged_like` builds one shaped like a
model's dense cache). A page table names each row's pages in position
order; it is the same for every layer, so the layers' caches do not hold
it: the decoder takes it once per call and each layer's attention reads
its pages through it (`PagedView`).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys and values [B, S, G, K] by position."""

  key_BSGK: jax.Array
  value_BSGK: jax.Array

  @classmethod
  def zeros(cls, batch: int, length: int, num_kv_heads: int, head_dim: int,
            dtype) -> "KVCache":
    shape = (batch, length, num_kv_heads, head_dim)
    return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

  @property
  def length(self) -> int:
    return self.key_BSGK.shape[-3]

  def write(self, k_BLGK: jax.Array, v_BLGK: jax.Array,
            start_B: jax.Array) -> "KVCache":
    """The cache with row b's L new entries at slots start_B[b]...

    The caller keeps `start_B + L <= S` (`dynamic_update_slice` would clamp
    the start otherwise).
    """
    def write_row(cache_SGK, new_LGK, start):
      return jax.lax.dynamic_update_slice(
          cache_SGK, new_LGK.astype(cache_SGK.dtype), (start, 0, 0))

    write = jax.vmap(write_row)
    return KVCache(write(self.key_BSGK, k_BLGK, start_B),
                   write(self.value_BSGK, v_BLGK, start_B))

  def gather(self) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B, S, G, K], slot j holding position j (as
    `PagedView.gather`)."""
    return self.key_BSGK, self.value_BSGK


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
  """A layer's pool of key and value pages [P, p, G, K].

  Holds no page table: one table [B, N] serves every layer, so the decoder
  takes it once per call (`Decoder.__call__(..., page_table_BN=...)`) and
  hands it to each layer's attention as a `PagedView` rather than carrying
  a copy in each layer's cache state. With stacked layers both fields have
  a leading layer axis.
  """

  key_pages_PpGK: jax.Array
  value_pages_PpGK: jax.Array
  impl: str = dataclasses.field(default="auto", metadata=dict(static=True))

  @property
  def page_size(self) -> int:
    return self.key_pages_PpGK.shape[-3]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedView:
  """A layer's `PagedKVCache` read through a page table: what attention
  writes to and reads.

  Row b's position t sits in page `page_table_BN[b, t // p]`, slot `t % p`
  (the layout of `maxtext.kernels.paged_attention`). Who owns which page is
  the caller's business (`maxtext.inference.page_pool`); this class only
  honours the table. A table entry may name a scratch page that several rows
  share (an unallocated page): what is written there is garbage, and the
  caller keeps such positions masked. The rows' lengths are not stored:
  like `KVCache`, the cache is read by the positions of the queries.

  Decode steps (one token per row) read the pages with
  `paged_attention.paged_attention(..., impl=pages.impl)`; longer calls
  (prefill) gather each row's pages into a dense [B, N * p, G, K] view
  (`gather`).
  """

  pages: PagedKVCache
  page_table_BN: jax.Array

  @property
  def length(self) -> int:
    """Positions each row can hold: N * T."""
    return self.page_table_BN.shape[-1] * self.pages.page_size

  def write(self, k_BLGK: jax.Array, v_BLGK: jax.Array,
            start_B: jax.Array) -> "PagedView":
    """The view with row b's L new entries at positions start_B[b]...

    The caller keeps `start_B + L <= N * T`.
    """
    page_size = self.pages.page_size
    positions_BL = start_B[:, None] + jnp.arange(k_BLGK.shape[1])
    page_BL = jnp.take_along_axis(self.page_table_BN,
                                  positions_BL // page_size, axis=1)
    slot_BL = positions_BL % page_size

    def write(pages_PpGK, new_BLGK):
      return pages_PpGK.at[page_BL, slot_BL].set(
          new_BLGK.astype(pages_PpGK.dtype))

    pages = dataclasses.replace(
        self.pages,
        key_pages_PpGK=write(self.pages.key_pages_PpGK, k_BLGK),
        value_pages_PpGK=write(self.pages.value_pages_PpGK, v_BLGK))
    return dataclasses.replace(self, pages=pages)

  def gather(self) -> tuple[jax.Array, jax.Array]:
    """Dense keys and values [B, N * p, G, K], slot j holding position j."""
    batch = self.page_table_BN.shape[0]

    def dense(pages_PpGK):
      return pages_PpGK[self.page_table_BN].reshape(
          (batch, self.length) + pages_PpGK.shape[-2:])

    return (dense(self.pages.key_pages_PpGK),
            dense(self.pages.value_pages_PpGK))


def paged_like(cache, *, num_pages: int, page_size: int, impl: str = "auto"):
  """`cache` (a tree of `KVCache`s, holding arrays or only their shapes)
  with every `KVCache` replaced by an empty `PagedKVCache` of the same
  heads, head dim and dtype: `num_pages` pages of `page_size` tokens.
  Other arrays in the tree (a Gated DeltaNet layer's state) become zeros
  of their shape.

  Layers stacked in `cache` (a leading layer axis) stay stacked: the pages
  get the same leading axes.
  """
  def pages(array_BSGK):
    *leading, _, _, heads, width = array_BSGK.shape
    return jnp.zeros((*leading, num_pages, page_size, heads, width),
                     array_BSGK.dtype)

  def paged(layer):
    if not isinstance(layer, KVCache):
      return jnp.zeros(layer.shape, layer.dtype)
    return PagedKVCache(pages(layer.key_BSGK), pages(layer.value_BSGK),
                        impl)

  return jax.tree.map(paged, cache,
                      is_leaf=lambda node: isinstance(node, KVCache))


def check_page_table(cache, page_table_BN: jax.Array | None) -> None:
  """A cache of `PagedKVCache`s needs a page table; any other takes none."""
  paged = any(isinstance(node, PagedKVCache) for node in jax.tree.leaves(
      cache, is_leaf=lambda node: isinstance(node, PagedKVCache)))
  if paged != (page_table_BN is not None):
    kind = "a paged" if paged else ("no" if cache is None else "a dense")
    given = "None" if page_table_BN is None else "an array"
    raise ValueError(
        "A paged KV cache (`paged_like`) is read through page_table_BN, and "
        f"only a paged one takes it: got {kind} cache and page_table_BN="
        f"{given}.")


def check_decode_args(segment_ids_BL, positions_BL) -> None:
  """Decoding with a KV cache takes positions and no segment ids."""
  if segment_ids_BL is not None or positions_BL is None:
    raise ValueError("Decoding with a KV cache needs positions_BL and "
                     "takes no segment_ids_BL.")
