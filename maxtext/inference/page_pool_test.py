"""Tests of the page allocator against a plain-Python free-list allocator:
the same page ids go to the same table entries through a run of
allocations and releases, no page is held twice, and a pool that runs out
says so."""

from absl.testing import absltest
import jax
import numpy as np

from maxtext.inference import page_pool


class _PythonPool:
  """The allocator in plain Python: a stack of free ids, popped row by row
  in page order, pushed back in the same order on release."""

  def __init__(self, batch, pages_per_row, num_pages):
    self.table = np.zeros((batch, pages_per_row), np.int32)
    self.free = list(range(num_pages, 0, -1))
    self.overflow = False

  def allocate(self, want):
    for b, n in zip(*np.nonzero(want & (self.table == 0))):
      if self.free:
        self.table[b, n] = self.free.pop()
      else:
        self.overflow = True

  def release(self, rows):
    for b, n in zip(*np.nonzero(rows[:, None] & (self.table != 0))):
      self.free.append(int(self.table[b, n]))
    self.table[rows] = 0


class PagePoolTest(absltest.TestCase):

  def test_allocations_and_releases_match_python(self):
    batch, pages_per_row, num_pages = 4, 5, 12
    pool = page_pool.PagePool.create(batch, pages_per_row, num_pages)
    want = _PythonPool(batch, pages_per_row, num_pages)
    allocate, release = jax.jit(page_pool.PagePool.allocate), jax.jit(
        page_pool.PagePool.release)
    rng = np.random.RandomState(0)
    for step in range(40):
      if step % 3 == 2:
        rows = rng.rand(batch) < 0.3
        pool, _ = release(pool, rows), want.release(rows)
      else:
        entries = rng.rand(batch, pages_per_row) < 0.15
        pool, _ = allocate(pool, entries), want.allocate(entries)
      table = np.asarray(pool.page_table_BN)
      np.testing.assert_array_equal(table, want.table, err_msg=f"{step=}")
      held = table[table != 0]
      self.assertEqual(len(set(held.tolist())), held.size)
      free = np.asarray(pool.free_P)[:int(pool.free_count)]
      self.assertEqual(free.tolist(), want.free)
      self.assertEqual(bool(pool.overflow), want.overflow)

  def test_positions_get_their_page_and_overflow_is_flagged(self):
    pool = page_pool.PagePool.create(2, 3, 3)
    pool = pool.allocate_positions(np.int32([0, 5]), 2, np.bool_([True, True]))
    np.testing.assert_array_equal(pool.page_table_BN, [[1, 0, 0], [0, 0, 2]])
    pool = pool.allocate_positions(np.int32([2, 3]), 2,
                                   np.bool_([True, False]))
    self.assertFalse(pool.overflow)
    pool = pool.allocate_positions(np.int32([4, 1]), 2, np.bool_([True, True]))
    self.assertTrue(pool.overflow)
    np.testing.assert_array_equal(pool.page_table_BN, [[1, 3, 0], [0, 0, 2]])

  def test_bad_sizes(self):
    with self.assertRaisesRegex(ValueError, "num_pages=0"):
      page_pool.PagePool.create(2, 3, 0)


if __name__ == "__main__":
  absltest.main()
