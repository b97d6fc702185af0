"""Gated MLP: `down(act(gate(x)) * up(x))`.

Shape key: B batch, L length, D embed dim, F mlp dim.

The hidden activation is constrained to the logical axes (batch, length,
mlp) and named for remat: "mlp_gate", "mlp_up", "mlp_hidden" and "mlp_out".
"""

import jax
from jax.ad_checkpoint import checkpoint_name
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
    hidden_names = (axes.BATCH, axes.LENGTH, axes.MLP)
    gate_BLF = checkpoint_name(axes.constrain(self.gate(x_BLD), hidden_names),
                               "mlp_gate")
    up_BLF = checkpoint_name(axes.constrain(self.up(x_BLD), hidden_names),
                             "mlp_up")
    h_BLF = checkpoint_name(self.activation(gate_BLF) * up_BLF, "mlp_hidden")
    return checkpoint_name(self.down(h_BLF), "mlp_out")
