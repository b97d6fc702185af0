"""Gated MLP: `down(unit(gate(x), up(x)))`, unit e.g. `act(gate) * up`.

Shape key: B batch, L length, D embed dim, F mlp dim.

The hidden activation is constrained to the logical axes (batch, length,
mlp) and named for remat: "mlp_gate", "mlp_up", "mlp_hidden" and "mlp_out".
"""

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.layers import linear



def clamped_swiglu(gate: jax.Array, up: jax.Array, alpha: float = 1.702,
                   limit: float = 7.0) -> jax.Array:
  """GPT-OSS's gated unit: with g = min(gate, limit) and
  u = clip(up, -limit, limit), `(u + 1) * g * sigmoid(alpha * g)`."""
  gate = jnp.minimum(gate, limit)
  up = jnp.clip(up, -limit, limit)
  return (up + 1) * gate * jax.nn.sigmoid(alpha * gate)


# `ModelConfig.mlp_activation` -> gated unit (gate, up) -> hidden.
GATED_UNITS = {
    "silu": lambda gate, up: jax.nn.silu(gate) * up,
    "gelu_tanh": lambda gate, up: jax.nn.gelu(gate, approximate=True) * up,
    "clamped_swiglu": clamped_swiglu,
}


class MLP(nnx.Module):
  """Gated MLP with a SiLU (SwiGLU), tanh-GELU (GeGLU) or clamped SwiGLU
  unit."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    def project(in_dim, out_dim, in_axis, out_axis):
      return linear.Linear((in_dim,), (out_dim,), in_axes=(in_axis,),
                           out_axes=(out_axis,), dtype=cfg.dtype,
                           param_dtype=cfg.param_dtype, rngs=rngs)

    self.gate = project(cfg.embed_dim, cfg.mlp_dim, axes.EMBED, axes.MLP)
    self.up = project(cfg.embed_dim, cfg.mlp_dim, axes.EMBED, axes.MLP)
    self.down = project(cfg.mlp_dim, cfg.embed_dim, axes.MLP, axes.EMBED)
    self.gated_unit = GATED_UNITS[cfg.mlp_activation]

  def __call__(self, x_BLD: jax.Array) -> jax.Array:
    hidden_names = (axes.BATCH, axes.LENGTH, axes.MLP)
    gate_BLF = checkpoint_name(axes.constrain(self.gate(x_BLD), hidden_names),
                               "mlp_gate")
    up_BLF = checkpoint_name(axes.constrain(self.up(x_BLD), hidden_names),
                             "mlp_up")
    h_BLF = checkpoint_name(self.gated_unit(gate_BLF, up_BLF), "mlp_hidden")
    return checkpoint_name(self.down(h_BLF), "mlp_out")
