"""`Linear`: a projection between multi-axis feature shapes with named axes.

The kernel has shape `in_shape + out_shape` and logical axis names
`in_axes + out_axes`; the call contracts the last `len(in_shape)` axes of the
input. Examples: queries `[D] -> [H, K]`, attention output `[H, K] -> [D]`.
An optional bias has shape `out_shape` and axis names `out_axes`.
"""

from collections.abc import Callable
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes


def fold_batch(batch_shape: tuple[int, ...]) -> bool:
  """Whether a projection folds its input's leading axes [B, L, ...] into
  one before its dot.

  With several, the kernel's gradient contracts two axes of the output
  gradient, and XLA CPU then copies that whole gradient transposed before
  the dot (for the vocabulary projection a [V, B * L] copy, a fifth of a
  small model's step); with one it does not, and the reshapes are free. Not
  where the activation sharding splits the length (sequence parallelism):
  the partitioner then gathers the folded axis.
  """
  return len(batch_shape) > 1 and not axes.splits(axes.LENGTH,
                                                  batch_shape[1])


def batch_folded(project: Callable[[jax.Array], jax.Array], x: jax.Array,
                 num_in: int) -> jax.Array:
  """`project(x)` for a projection that contracts the last `num_in` axes of
  `x`, with x's leading axes folded into one where `fold_batch` says so
  (and the result's unfolded again)."""
  batch_shape = x.shape[:x.ndim - num_in]
  if fold_batch(batch_shape):
    x = x.reshape((-1, *x.shape[len(batch_shape):]))
  y = project(x)
  return y.reshape((*batch_shape, *y.shape[x.ndim - num_in:]))


class Linear(nnx.Module):
  """Projection `y = x . kernel (+ bias)` over the trailing input axes."""

  def __init__(
      self,
      in_shape: Sequence[int],
      out_shape: Sequence[int],
      *,
      in_axes: Sequence[str],
      out_axes: Sequence[str],
      dtype: str,
      param_dtype: str,
      rngs: nnx.Rngs,
      use_bias: bool = False,
  ):
    num_in = len(in_shape)
    init = nnx.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal",
        in_axis=tuple(range(num_in)),
        out_axis=tuple(range(num_in, num_in + len(out_shape))))
    self.kernel = axes.param(
        init(rngs.params(), (*in_shape, *out_shape), jnp.dtype(param_dtype)),
        (*in_axes, *out_axes))
    if use_bias:
      self.bias = axes.param(
          jnp.zeros(tuple(out_shape), jnp.dtype(param_dtype)), tuple(out_axes))
    else:
      self.bias = None
    self.num_in = num_in
    self.dtype = jnp.dtype(dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.kernel[...]
    # Cast only when the dtypes differ: a kernel quantized by qwix (QLoRA,
    # a quantized teacher) is no array and cannot be cast.
    if kernel.dtype != self.dtype:
      kernel = kernel.astype(self.dtype)

    def project(x):
      contracting = tuple(range(x.ndim - self.num_in, x.ndim))
      return jax.lax.dot_general(x.astype(self.dtype), kernel,
                                 ((contracting, tuple(range(self.num_in))),
                                  ((), ())))

    y = batch_folded(project, x, self.num_in)
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y
