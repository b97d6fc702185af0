"""RMSNorm, including Gemma's `(1 + scale)` form."""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes


class RMSNorm(nnx.Module):
  """`y = x / rms(x) * (offset + scale)`, computed in float32.

  With `offset = 1` (Gemma) the scale starts at zero; with `offset = 0` it
  starts at one. Either way the initial multiplier is one.
  """

  def __init__(self, dim: int, *, axis_name: str, eps: float, offset: float,
               param_dtype: str):
    self.scale = axes.param(
        jnp.full((dim,), 1.0 - offset, jnp.dtype(param_dtype)), (axis_name,))
    self.eps = eps
    self.offset = offset

  def __call__(self, x: jax.Array) -> jax.Array:
    x_f32 = x.astype(jnp.float32)
    mean_square = jnp.mean(jnp.square(x_f32), axis=-1, keepdims=True)
    y = x_f32 * jax.lax.rsqrt(mean_square + self.eps)
    return (y * (self.offset + self.scale[...].astype(jnp.float32))).astype(
        x.dtype)
