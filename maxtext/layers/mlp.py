"""Gated MLP: `down(unit(gate(x), up(x)))`, unit e.g. `act(gate) * up`.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.

The hidden activation is constrained to the logical axes (batch, length,
mlp) and named for remat: "mlp_gate", "mlp_up", "mlp_hidden" and "mlp_out".
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from flax import nnx

from maxtext.common import axes
from maxtext.common import sections
from maxtext.layers import linear


def clamped_swiglu(gate: jax.Array, up: jax.Array, alpha: float = 1.702,
                   limit: float = 7.0) -> jax.Array:
  """GPT-OSS's gated unit: with g = min(gate, limit) and
  u = clip(up, -limit, limit), `(u + 1) * g * sigmoid(alpha * g)`."""
  gate = jnp.minimum(gate, limit)
  up = jnp.clip(up, -limit, limit)
  return (up + 1) * gate * jax.nn.sigmoid(alpha * gate)


# `MlpConfig.activation` -> gated unit (gate, up) -> hidden.
GATED_UNITS = {
    "silu": lambda gate, up: jax.nn.silu(gate) * up,
    "gelu_tanh": lambda gate, up: jax.nn.gelu(gate, approximate=True) * up,
    "clamped_swiglu": clamped_swiglu,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MlpConfig:
  """A model's dense MLP (`ModelConfig.mlp`).

  Attributes (their `model` section keys in `KEYS`):
    dim: Hidden width (F).
    activation: Gated unit, of the MLP and of the experts: "silu" (SwiGLU),
      "gelu_tanh" (GeGLU) or "clamped_swiglu" (GPT-OSS; `clamped_swiglu`).
    kv_shared_dim: Hidden width of the MLP of the layers that share keys
      and values (`PatternConfig.kv_shared_layers`; Gemma 4 e2b's
      double-wide MLP); 0: `dim`.
  """

  KEYS: ClassVar[dict[str, str]] = {"dim": "mlp_dim",
                                    "activation": "mlp_activation",
                                    "kv_shared_dim": "mlp_kv_shared_dim"}

  dim: int
  activation: str = "silu"
  kv_shared_dim: int = 0

  def __post_init__(self):
    if isinstance(self.dim, bool) or not isinstance(self.dim, int) or (
        self.dim < 1):
      sections.fail_part(self, "dim", "must be a positive integer")
    if isinstance(self.kv_shared_dim, bool) or not isinstance(
        self.kv_shared_dim, int) or self.kv_shared_dim < 0:
      sections.fail_part(self, "kv_shared_dim",
                         "must be an integer >= 0 (0: mlp_dim)")
    if self.activation not in GATED_UNITS:
      sections.fail_part(self, "activation",
                         f"valid values are {tuple(GATED_UNITS)}")


class MLP(nnx.Module):
  """Gated MLP with a SiLU (SwiGLU), tanh-GELU (GeGLU) or clamped SwiGLU
  unit; with `output_gate` its output times sigmoid(x . w), w a learned
  [embed] vector `output_gate` (Qwen3-Next's gated shared expert)."""

  def __init__(self, cfg: MlpConfig, *, embed_dim: int, dtype: str,
               param_dtype: str, rngs: nnx.Rngs, output_gate: bool = False):
    def project(in_dim, out_dim, in_axis, out_axis):
      return linear.Linear((in_dim,), (out_dim,), in_axes=(in_axis,),
                           out_axes=(out_axis,), dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs)

    self.gate = project(embed_dim, cfg.dim, axes.EMBED, axes.MLP)
    self.up = project(embed_dim, cfg.dim, axes.EMBED, axes.MLP)
    self.down = project(cfg.dim, embed_dim, axes.MLP, axes.EMBED)
    self.gated_unit = GATED_UNITS[cfg.activation]
    self.output_gate = (project(embed_dim, 1, axes.EMBED, None)
                        if output_gate else None)

  def __call__(self, x_BLD: jax.Array) -> jax.Array:
    hidden_names = (axes.BATCH, axes.LENGTH, axes.MLP)
    gate_BLF = checkpoint_name(axes.constrain(self.gate(x_BLD), hidden_names),
                               "mlp_gate")
    up_BLF = checkpoint_name(axes.constrain(self.up(x_BLD), hidden_names),
                             "mlp_up")
    h_BLF = checkpoint_name(self.gated_unit(gate_BLF, up_BLF), "mlp_hidden")
    out_BLD = checkpoint_name(self.down(h_BLF), "mlp_out")
    if self.output_gate is None:
      return out_BLD
    return out_BLD * jax.nn.sigmoid(self.output_gate(x_BLD))
