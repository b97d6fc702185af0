"""Comparing two pytrees of arrays leaf by leaf, for tests."""

import jax
import numpy as np


def assert_trees_close(got, want, *, rtol: float, atol: float = 0.0,
                       scaled_atol: float = 0.0) -> None:
  """Each leaf of `got` within `rtol` of `want`'s, or `atol`, or
  `scaled_atol` times the leaf's largest magnitude, whichever is larger;
  a failure names the leaf's path.

  Raises:
    AssertionError: a leaf differs, or the trees have different leaves.
  """
  flat_got = jax.tree_util.tree_leaves_with_path(got)
  flat_want = jax.tree.leaves(want)
  if len(flat_got) != len(flat_want):
    raise AssertionError(f"{len(flat_got)} leaves, want {len(flat_want)}.")
  for (path, a), b in zip(flat_got, flat_want):
    b = np.asarray(b)
    np.testing.assert_allclose(
        np.asarray(a), b, rtol=rtol,
        atol=max(atol, scaled_atol * float(np.abs(b).max(initial=0.0))),
        err_msg=jax.tree_util.keystr(path))
