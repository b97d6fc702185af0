"""Comparing arrays, and pytrees of arrays leaf by leaf, for tests.

Two programs that compute the same float32 result in another order (XLA
against numpy, a sharded step against one device, one CPU's instruction set
against another's) differ by rounding that grows with the values summed,
not with the result: a gradient that cancels to 0.01 from terms of 10 can
be off by 1e-5 absolute, far past any rtol. So compare against a tolerance
scaled to the array's largest magnitude (`scaled_atol`) as well as the
element's (`rtol`): about 1e-5 for forward results of short reductions,
1e-4 or more for gradients and long reductions. What a wrong result gives
(a dropped term, a wrong mask, a transposed weight) is off by far more.
"""

import jax
import numpy as np


def assert_close(got, want, *, rtol: float, atol: float = 0.0,
                 scaled_atol: float = 0.0, err_msg: str = "") -> None:
  """`got` within `rtol` of `want` element by element, or `atol`, or
  `scaled_atol` times `want`'s largest magnitude, whichever is larger.

  Raises:
    AssertionError: an element differs, or the shapes do.
  """
  want = np.asarray(want)
  np.testing.assert_allclose(
      np.asarray(got), want, rtol=rtol,
      atol=max(atol, scaled_atol * float(np.abs(want).max(initial=0.0))),
      err_msg=err_msg)


def assert_trees_close(got, want, *, rtol: float, atol: float = 0.0,
                       scaled_atol: float = 0.0) -> None:
  """Each leaf of `got` close to `want`'s as `assert_close` compares them;
  a failure names the leaf's path.

  Raises:
    AssertionError: a leaf differs, or the trees have different leaves.
  """
  flat_got = jax.tree_util.tree_leaves_with_path(got)
  flat_want = jax.tree.leaves(want)
  if len(flat_got) != len(flat_want):
    raise AssertionError(f"{len(flat_got)} leaves, want {len(flat_want)}.")
  for (path, a), b in zip(flat_got, flat_want):
    assert_close(a, b, rtol=rtol, atol=atol, scaled_atol=scaled_atol,
                 err_msg=jax.tree_util.keystr(path))
