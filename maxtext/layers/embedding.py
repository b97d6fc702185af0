"""Token embedding with an optional sqrt(dim) scale and a tied output head.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.layers import linear


class Embedder(nnx.Module):
  """Looks up token vectors; `attend` reuses the table as the output head."""

  def __init__(self, vocab_size: int, embed_dim: int, *,
               scale_by_sqrt_dim: bool, dtype: str, param_dtype: str,
               rngs: nnx.Rngs, multiplier: float | None = None):
    """`multiplier`: of the vectors, in place of sqrt(embed_dim) (or 1 when
    not `scale_by_sqrt_dim`)."""
    init = nnx.initializers.variance_scaling(1.0, "fan_in", "normal",
                                             in_axis=1, out_axis=0)
    self.embedding = axes.param(
        init(rngs.params(), (vocab_size, embed_dim), jnp.dtype(param_dtype)),
        (axes.VOCAB, axes.EMBED))
    if multiplier is None:
      multiplier = embed_dim**0.5 if scale_by_sqrt_dim else 1.0
    self.multiplier = multiplier
    self.dtype = jnp.dtype(dtype)

  def __call__(self, tokens_BL: jax.Array) -> jax.Array:
    """Returns token vectors [B, L, D] in the compute dtype."""
    table_VD = self.embedding[...]
    # The multiplier is rounded to the table's dtype, as in the reference
    # Gemma implementations.
    x_BLD = table_VD[tokens_BL] * jnp.asarray(self.multiplier, table_VD.dtype)
    return x_BLD.astype(self.dtype)

  def attend(self, x_BLD: jax.Array) -> jax.Array:
    """Logits [B, L, V] = x . embedding^T (tied output head)."""
    table_VD = self.embedding[...].astype(self.dtype)
    return linear.batch_folded(
        lambda x: jnp.einsum("...d,vd->...v", x, table_VD),
        x_BLD.astype(self.dtype), num_in=1)
