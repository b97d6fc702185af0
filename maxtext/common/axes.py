"""Logical axis names for parameters and activations, annotated params, and
the shape key.

Parameters carry these names where they are created (flax NNX `out_sharding`
metadata, see `param`); a sharding rule table (config data,
`maxtext.sharding.rules`) maps each logical name to mesh axes. Activations
use the same names in sharding constraints (`constrain`), which take effect
only inside `activation_sharding(...)`; outside it they do nothing, so layers
run unchanged on one device.

Hot code names a tensor with a shape suffix, one letter per dimension
(`q_BLHK`: batch, length, query heads, head dim; `../shared/STYLE.md`).
`SHAPE_KEY` is the one table of those letters: a letter means the same in
every module (`//tools/lint:module_size_test` checks the suffixes), and a
module's docstring names only the letters it uses that need its context.
"""

from collections.abc import Iterator, Sequence
import contextlib
import contextvars
from typing import Any, Protocol

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

# Shape suffix letter -> the dimension it names, in every module.
SHAPE_KEY = {
    # Sequences and the residual stream.
    "B": "batch rows (sequences)",
    "L": "length: the positions a call computes (queries; a prompt)",
    "S": "key/value positions: the keys attended to, the cache length",
    "T": "tokens: batch and length flattened (B * L)",
    "I": "tokens a decode loop generates",
    "D": "embed dim: the residual stream",
    "V": "vocabulary",
    # Attention.
    "H": "query heads",
    "G": "key/value heads",
    "R": "query heads per key/value head (H // G)",
    "K": "query/key head dim (MLA: the rotary part)",
    "k": "half the head dim: rotary pairs",
    "U": "value head dim, where it differs from K (MLA, linear attention)",
    "O": "MLA: the non-rotary part of a query/key head",
    "Q": "MLA: rank of the low-rank query projection",
    "Z": "MLA: width of the compressed key/value latent",
    "x": "two widths above concatenated (MLA: O + K, O + U, Z + K)",
    "1": "a dimension of size one",
    # MLP and experts.
    "F": "MLP hidden dim (dense, or one expert's)",
    "E": "experts",
    "A": "experts a token is routed to (top-k)",
    "Y": "token-expert assignments (T * A)",
    "C": "slots of one expert (capacity)",
    "W": "expert-parallel shards",
    "X": "experts on one shard (E // W)",
    "J": "rows one shard receives in the token exchange (W * Y)",
    "l": "layers: of a stack, or the expert layers",
    # Paged KV cache.
    "P": "pages in the pool",
    "N": "pages of one row: the page table's width",
    "p": "tokens per page",
    # Microbatches and pipeline.
    "M": "microbatches",
    "b": "rows of one microbatch",
    "g": "pipeline stages",
    "r": "pipeline repeats (passes through the stages)",
    # Attention kernels' tiles.
    "c": "ring attention: one device's chunk of the length",
    "m": "query blocks (tiles) of a kernel",
    "n": "key blocks (tiles) of a kernel",
    "q": "queries per block",
    "s": "keys per block",
    # Linear attention (the chunked gated delta rule).
    "j": "chunks of the length",
    "i": "positions within one chunk",
    "y": "taps of a causal convolution, less one (its state)",
    # Vision towers.
    "v": "images",
    "t": "patches of an image (the tower's tokens)",
    "u": "soft tokens of an image in the decoder",
    "h": "pixel rows of an image",
    "w": "pixel columns of an image",
    "e": "color channels",
    "d": "width of a vision tower",
}

# Activation axes.
BATCH = "batch"
LENGTH = "length"
# Length of keys and values inside attention (kept whole by default, so a
# sequence-sharded query attends to every key: all-gathered context).
KV_LENGTH = "kv_length"


class Constrainer(Protocol):
  """Maps logical activation axes to a sharding constraint."""

  def constrain(self, x: jax.Array,
                names: Sequence[str | None]) -> jax.Array: ...

  def compute_spec(self, names: Sequence[str | None],
                   shape: Sequence[int]) -> jax.sharding.PartitionSpec: ...


_CONSTRAINER: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "maxtext_activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(constrainer: Constrainer | None) -> Iterator[None]:
  """Within this context `constrain` applies `constrainer` (None: no-op)."""
  token = _CONSTRAINER.set(constrainer)
  try:
    yield
  finally:
    _CONSTRAINER.reset(token)


def current_constrainer() -> Constrainer | None:
  """The constrainer of the innermost `activation_sharding` (None outside).

  For code whose compute layout is more than constraints: the experts'
  token exchange and the kernels' shard_map read its mesh and rules.
  """
  return _CONSTRAINER.get()


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """`x` with the compute layout of logical axes `names` (one per dim)."""
  constrainer = _CONSTRAINER.get()
  if constrainer is None:
    return x
  return constrainer.constrain(x, names)


def splits(name: str, size: int) -> bool:
  """Whether the activation sharding in effect splits logical axis `name`
  of size `size` over devices (False outside `activation_sharding`)."""
  constrainer = _CONSTRAINER.get()
  return (constrainer is not None and
          constrainer.compute_spec((name,), (size,))[0] is not None)


def spec_axes(spec: jax.sharding.PartitionSpec,
              ndim: int) -> tuple[tuple[str, ...], ...]:
  """The mesh axes that split each of `ndim` dimensions under `spec`, one
  tuple per dimension (() where it is not split)."""
  entries = tuple(spec) + (None,) * (ndim - len(spec))
  return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e)
               for e in entries)


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
