"""Which pages of a paged KV cache each row holds: an on-demand allocator.

A pool of `num_pages` pages, ids 1..num_pages, shared by the rows; id 0 is
a scratch page nobody owns. `page_table_BN[b, n]` names the page holding row
b's positions n*T .. n*T+T-1, or 0 while that page is not allocated: writes
there land in the scratch page, and queries never see them (attention is
causal by position and a row's allocated pages cover its positions).

`allocate` gives pages to the table entries asked for (a prompt's pages at
prefill, the next page when a row's position crosses into it), `release`
returns a finished row's pages to the pool, so rows that stop early make
room for the others. Free pages are a stack; everything is traced (jit and
`lax.while_loop` friendly). Asking for more pages than are free sets
`overflow` (the entries that missed stay 0), which the caller reports.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses

import jax
import jax.numpy as jnp

SCRATCH_PAGE = 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagePool:
  """A page table and the free pages.

  Attributes:
    page_table_BN: int32 page ids, SCRATCH_PAGE where none is allocated.
    free_P: int32 stack of page ids; `free_P[:free_count]` are free.
    free_count: int32 scalar, number of free pages.
    overflow: bool scalar, an allocation found no free page.
  """

  page_table_BN: jax.Array
  free_P: jax.Array
  free_count: jax.Array
  overflow: jax.Array

  @classmethod
  def create(cls, batch: int, pages_per_row: int,
             num_pages: int) -> "PagePool":
    """No page allocated; pages 1, 2, ... are handed out in that order."""
    if num_pages < 1 or pages_per_row < 1:
      raise ValueError(f"num_pages={num_pages} and pages_per_row="
                       f"{pages_per_row} must be >= 1.")
    return cls(jnp.full((batch, pages_per_row), SCRATCH_PAGE, jnp.int32),
               jnp.arange(num_pages, 0, -1, dtype=jnp.int32),
               jnp.int32(num_pages), jnp.bool_(False))

  def allocate(self, want_BN: jax.Array) -> "PagePool":
    """Gives a free page to every entry in `want_BN` that has none (row by
    row, in page order)."""
    need_BN = want_BN & (self.page_table_BN == SCRATCH_PAGE)
    rank_BN = jnp.cumsum(need_BN.ravel()).reshape(need_BN.shape) - 1
    slot_BN = self.free_count - 1 - rank_BN
    got_BN = need_BN & (slot_BN >= 0)
    page_BN = self.free_P[jnp.maximum(slot_BN, 0)]
    return dataclasses.replace(
        self,
        page_table_BN=jnp.where(got_BN, page_BN, self.page_table_BN),
        free_count=self.free_count - got_BN.sum(dtype=jnp.int32),
        overflow=self.overflow | jnp.any(need_BN & ~got_BN))

  def allocate_positions(self, positions_B: jax.Array, page_size: int,
                         rows_B: jax.Array) -> "PagePool":
    """Gives each row in `rows_B` the page of its position `positions_B`."""
    columns_N = jnp.arange(self.page_table_BN.shape[1])
    return self.allocate(
        rows_B[:, None] & (columns_N == positions_B[:, None] // page_size))

  def release(self, rows_B: jax.Array) -> "PagePool":
    """Returns the pages of the rows in `rows_B` to the pool."""
    give_BN = rows_B[:, None] & (self.page_table_BN != SCRATCH_PAGE)
    rank_BN = jnp.cumsum(give_BN.ravel()).reshape(give_BN.shape) - 1
    # Entries not given back point past the stack and are dropped.
    slot_BN = jnp.where(give_BN, self.free_count + rank_BN,
                        self.free_P.shape[0])
    return dataclasses.replace(
        self,
        page_table_BN=jnp.where(rows_B[:, None], SCRATCH_PAGE,
                                self.page_table_BN),
        free_P=self.free_P.at[slot_BN.ravel()].set(
            self.page_table_BN.ravel(), mode="drop"),
        free_count=self.free_count + give_BN.sum(dtype=jnp.int32))
