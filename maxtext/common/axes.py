"""Logical axis names for parameters and activations, and annotated params.

Parameters carry these names where they are created (flax NNX `out_sharding`
metadata, see `param`); a sharding rule table (config data) later maps each
logical name to mesh axes. Activations use the same names in sharding
constraints.
"""

from collections.abc import Sequence

import jax
from flax import nnx

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
# Leading axis of parameters stacked over layers (scanned layout).
LAYERS = "layers"

# Activation axes.
BATCH = "batch"
LENGTH = "length"


def param(value: jax.Array, names: Sequence[str]) -> nnx.Param:
  """A parameter whose axes carry logical names (one per dimension).

  The names are metadata only: parameters are placed on devices by the
  sharding layer (e.g. init under jit with out_shardings from
  `nnx.get_partition_spec`), so creating a model needs no mesh.
  """
  if len(names) != value.ndim:
    raise ValueError(
        f"Axis names {tuple(names)} do not match parameter shape "
        f"{value.shape}.")
  return nnx.Param(value, out_sharding=tuple(names), eager_sharding=False)
