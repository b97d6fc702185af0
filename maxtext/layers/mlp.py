"""Gated MLP: `down(act(gate(x)) * up(x))`.

Shape key: B batch, L length, D embed dim, F mlp dim.
"""

import jax
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.layers import linear

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


class MLP(nnx.Module):
  """Gated MLP with a SiLU (SwiGLU) or tanh-GELU (GeGLU) gate."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    def project(in_dim, out_dim, in_axis, out_axis):
      return linear.Linear((in_dim,), (out_dim,), in_axes=(in_axis,),
                           out_axes=(out_axis,), dtype=cfg.dtype,
                           param_dtype=cfg.param_dtype, rngs=rngs)

    self.gate = project(cfg.embed_dim, cfg.mlp_dim, axes.EMBED, axes.MLP)
    self.up = project(cfg.embed_dim, cfg.mlp_dim, axes.EMBED, axes.MLP)
    self.down = project(cfg.mlp_dim, cfg.embed_dim, axes.MLP, axes.EMBED)
    self.activation = ACTIVATIONS[cfg.mlp_activation]

  def __call__(self, x_BLD: jax.Array) -> jax.Array:
    h_BLF = self.activation(self.gate(x_BLD)) * self.up(x_BLD)
    return self.down(h_BLF)
