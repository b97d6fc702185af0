"""RMSNorm, including Gemma's `(1 + scale)` form, and `NormConfig`, the
model's norms (`ModelConfig.norm`)."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import sections


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormConfig:
  """The RMSNorms of a model (`ModelConfig.norm`).

  Attributes:
    eps: RMSNorm epsilon (`norm_eps`).
    offset: RMSNorm multiplies by `offset + scale` (Gemma: 1.0, with the
      scale initialised to zero) (`norm_offset`).
  """

  # Field -> its key in the config's `model` section.
  KEYS: ClassVar[dict[str, str]] = {"eps": "norm_eps", "offset": "norm_offset"}

  eps: float = 1e-6
  offset: float = 0.0

  def __post_init__(self):
    if self.eps <= 0:
      sections.fail_part(self, "eps", "must be positive")

  def rms_norm(self, dim: int | tuple[int, ...], *,
               axis_name: str | tuple[str, ...],
               param_dtype: str) -> "RMSNorm":
    """An RMSNorm of width `dim` (or over the last axes of sizes `dim`,
    named `axis_name`) with these settings."""
    return RMSNorm(dim, axis_name=axis_name, eps=self.eps, offset=self.offset,
                   param_dtype=param_dtype)


class RMSNorm(nnx.Module):
  """`y = x / rms(x) * (offset + scale)`, computed in float32.

  The root mean square is over the last axis, or over the last axes when
  `dim` is a tuple of their sizes (e.g. all heads of a projection: OLMo's
  q/k norms). With `offset = 1` (Gemma) the scale starts at zero; with
  `offset = 0` it starts at one. Either way the initial multiplier is one.
  """

  def __init__(self, dim: int | tuple[int, ...], *,
               axis_name: str | tuple[str, ...], eps: float, offset: float,
               param_dtype: str):
    shape = (dim,) if isinstance(dim, int) else tuple(dim)
    names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    self.scale = axes.param(
        jnp.full(shape, 1.0 - offset, jnp.dtype(param_dtype)), names)
    self.eps = eps
    self.offset = offset
    self.num_axes = len(shape)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = normalize(x, self.eps, self.num_axes)
    return (y * (self.offset + self.scale[...].astype(jnp.float32))).astype(
        x.dtype)


def normalize(x: jax.Array, eps: float, num_axes: int = 1) -> jax.Array:
  """`x / rms(x)` in float32, the root mean square over the last `num_axes`
  axes (`eps` added to the mean square): an RMSNorm without a scale."""
  x_f32 = x.astype(jnp.float32)
  over = tuple(range(-num_axes, 0))
  mean_square = jnp.mean(jnp.square(x_f32), axis=over, keepdims=True)
  return x_f32 * jax.lax.rsqrt(mean_square + eps)


class LayerNorm(nnx.Module):
  """`y = (x - mean(x)) / sqrt(var(x) + eps) * scale + bias` over the last
  axis, computed in float32 (the vision towers' norm: SigLIP)."""

  def __init__(self, dim: int, *, axis_name: str, eps: float,
               param_dtype: str):
    self.scale = axes.param(jnp.ones((dim,), jnp.dtype(param_dtype)),
                            (axis_name,))
    self.bias = axes.param(jnp.zeros((dim,), jnp.dtype(param_dtype)),
                           (axis_name,))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x_f32 = x.astype(jnp.float32)
    mean = jnp.mean(x_f32, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x_f32 - mean), axis=-1, keepdims=True)
    y = (x_f32 - mean) * jax.lax.rsqrt(variance + self.eps)
    return (y * self.scale[...].astype(jnp.float32) +
            self.bias[...].astype(jnp.float32)).astype(x.dtype)
