"""One attention interface over every implementation, and "auto" selection.

`attention(q, k, v, impl=..., scale=..., window=..., segment_ids_BL=...,
logit_softcap=..., sinks_H=..., mask_BLS=...)` computes the function of
`attention.reference_attention` (causal, or the explicit decoding mask) with
the implementation `impl`:

  reference  plain JAX, an L x S float32 score matrix; every feature.
  blockwise  flash-style plain JAX (`blockwise.py`); every feature; O(L)
             memory; the CPU default.
  xla        `jax.nn.dot_product_attention`, JAX's choice of backend; no
             soft-cap, no sinks.
  cudnn      the same with `implementation="cudnn"` (GPU, bfloat16/float16);
             no soft-cap, no sinks, no segment ids.
  splash     the TPU Pallas splash kernel (`splash.py`); no explicit mask.
  pallas_gpu flash attention as Pallas kernels lowered to Triton
             (`pallas_gpu.py`, GPU); no explicit mask.
  auto       per backend: TPU splash; GPU cuDNN where it serves the call
             and its library is installed, else pallas_gpu (soft-cap,
             sinks, segment ids, float32), else blockwise; CPU and others blockwise. With an explicit mask
             (decoding: few queries over a KV cache) TPU and GPU use the
             reference, CPU blockwise.
             Where blockwise would run on one tile (L <= block_q and
             S <= block_kv) auto takes the reference: the same computation,
             simpler to compile.

Context parallelism (`context_parallel`): when the compute rules split the
length (the `sequence` mesh axis), "allgather" runs `impl` on keys and
values gathered whole (the rules keep `kv_length` unsplit); "ring" runs
`ring.ring_attention` instead, which keeps them split and passes them round
the devices. Calls with an explicit mask (decoding) always take `impl`.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Callable
import dataclasses
import functools

import jax
import jax.numpy as jnp

from maxtext.common import sections
from maxtext.kernels import attention as attention_lib
from maxtext.kernels import blockwise
from maxtext.kernels import backend
from maxtext.kernels import pallas_gpu
from maxtext.kernels import ring
from maxtext.kernels import splash

IMPLS = ("auto", "reference", "blockwise", "xla", "cudnn", "splash",
         "pallas_gpu")
CONTEXT_PARALLELS = ("allgather", "ring")


@dataclasses.dataclass(frozen=True)
class _Impl:
  fn: Callable[..., jax.Array]
  unsupported: tuple[str, ...] = ()  # Features it cannot serve.
  platforms: tuple[str, ...] = ()  # Where it runs; () is everywhere.
  dtypes: tuple[object, ...] = ()  # Query dtypes it takes; () is any.
  blocks: bool = False  # Takes block_q / block_kv.
  per_shard: bool = False  # A Pallas kernel: run in a shard_map.


_IMPLS = {
    "reference": _Impl(attention_lib.reference_attention),
    "blockwise": _Impl(blockwise.blockwise_attention, blocks=True),
    "xla": _Impl(attention_lib.xla_attention,
                 unsupported=("logit_softcap", "sinks_H")),
    "cudnn": _Impl(functools.partial(attention_lib.xla_attention,
                                     implementation="cudnn"),
                   unsupported=("logit_softcap", "sinks_H",
                                "segment_ids_BL"),
                   platforms=("gpu",),
                   dtypes=(jnp.bfloat16, jnp.float16)),
    "splash": _Impl(splash.splash_attention, unsupported=("mask_BLS",),
                    platforms=("tpu",), blocks=True, per_shard=True),
    "pallas_gpu": _Impl(pallas_gpu.pallas_gpu_attention,
                        unsupported=("mask_BLS",), platforms=("gpu",),
                        blocks=True, per_shard=True),
}

# What "auto" tries on a GPU, first that serves the call first.
_GPU_ORDER = ("cudnn", "pallas_gpu")


def _unserved(name, features, platform, dtype):
  """Why `name` cannot serve the call, or None when it can."""
  impl = _IMPLS[name]
  missing = [f for f in features if f in impl.unsupported]
  if missing:
    return f"it does not support {', '.join(missing)}"
  if impl.platforms and platform not in impl.platforms:
    return f"it runs only on {impl.platforms}, not {platform!r}"
  if impl.dtypes and jnp.dtype(dtype) not in [jnp.dtype(d)
                                               for d in impl.dtypes]:
    return f"it takes {[jnp.dtype(d).name for d in impl.dtypes]}, not {dtype}"
  return None


def _check_context_parallel(context_parallel):
  if context_parallel not in CONTEXT_PARALLELS:
    raise ValueError(f"Unknown context_parallel {context_parallel!r}; "
                     f"valid: {CONTEXT_PARALLELS}.")


def select_impl(impl: str, *, features: tuple[str, ...], platform: str,
                dtype, one_tile: bool = False, cudnn: bool = True) -> str:
  """The concrete implementation for `impl` ("auto" resolved).

  Args:
    impl: One of `IMPLS`.
    features: The optional arguments in use, by name (`logit_softcap`,
      `sinks_H`, `segment_ids_BL`, `window`, `mask_BLS`).
    platform: Platform of the computation ("cpu", "gpu", "tpu"), e.g.
      `backend.target_platform()`.
    dtype: Query dtype.
    one_tile: The queries and keys fit one blockwise tile; "auto" then takes
      the reference (the same computation, simpler to compile) where it
      would take blockwise.
    cudnn: cuDNN's library is there (`backend.cudnn_available`); without
      it "auto" on a GPU skips cuDNN.

  Raises:
    ValueError: `impl` is unknown or cannot serve the call; the message names
      the implementations that can.
  """
  if impl == "auto":
    fallback = "reference" if one_tile else "blockwise"
    if "mask_BLS" in features:
      return fallback if platform == "cpu" else "reference"
    if platform == "tpu":
      return "splash"
    if platform == "gpu":
      for name in _GPU_ORDER:
        if (name != "cudnn" or cudnn) and not _unserved(name, features,
                                                       platform, dtype):
          return name
    return fallback
  if impl not in _IMPLS:
    raise ValueError(f"Unknown attention impl {impl!r}; valid: {IMPLS}.")
  reason = _unserved(impl, features, platform, dtype)
  if reason:
    valid = [n for n in _IMPLS if not _unserved(n, features, platform, dtype)]
    raise ValueError(
        f"Attention impl {impl!r} cannot serve this call on {platform!r}: "
        f"{reason}. Valid here: {['auto'] + valid}.")
  return impl


def attention(
    q_BLHK: jax.Array,
    k_BSGK: jax.Array,
    v_BSGK: jax.Array,
    *,
    impl: str = "auto",
    scale: float,
    window: int | None = None,
    segment_ids_BL: jax.Array | None = None,
    logit_softcap: float = 0.0,
    sinks_H: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    block_q: int = 512,
    block_kv: int = 512,
    context_parallel: str = "allgather",
) -> jax.Array:
  """Attention with implementation `impl`; see the module docstring.

  Args:
    q_BLHK: Queries.
    k_BSGK: Keys.
    v_BSGK: Values.
    impl: One of `IMPLS`.
    scale: Multiplier of the query-key dot products.
    window: A query sees this many keys, itself included; None: no window.
    segment_ids_BL: Tokens attend only to tokens with the same id.
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    sinks_H: Per-query-head sink logit (scaled-logit units); None: none.
    mask_BLS: Explicit mask replacing the causal, window and segment masks.
    block_q: Query tile of "blockwise", "splash", "pallas_gpu" and the
      ring.
    block_kv: Key tile of "blockwise", "splash", "pallas_gpu" and the ring.
    context_parallel: One of `CONTEXT_PARALLELS`: "ring" takes
      `ring.ring_attention` where the length is split and there is no
      `mask_BLS`.

  Returns:
    Attention output [B, L, H, K] in the dtype of `v_BSGK`.

  Raises:
    ValueError: `context_parallel` is unknown, or `impl` cannot serve the
      call (see `select_impl`).
  """
  _check_context_parallel(context_parallel)
  if (context_parallel == "ring" and mask_BLS is None and
      ring.context_axes(q_BLHK.shape[1])):
    return ring.ring_attention(q_BLHK, k_BSGK, v_BSGK, scale=scale,
                               window=window, segment_ids_BL=segment_ids_BL,
                               logit_softcap=logit_softcap, sinks_H=sinks_H,
                               block_q=block_q, block_kv=block_kv)
  kwargs = dict(window=window, segment_ids_BL=segment_ids_BL,
                logit_softcap=logit_softcap, sinks_H=sinks_H,
                mask_BLS=mask_BLS)
  features = tuple(name for name, value in kwargs.items()
                   if value is not None and (name != "logit_softcap" or value))
  one_tile = q_BLHK.shape[1] <= block_q and k_BSGK.shape[1] <= block_kv
  platform = backend.target_platform()
  name = select_impl(impl, features=features, platform=platform,
                     dtype=q_BLHK.dtype, one_tile=one_tile,
                     cudnn=platform != "gpu" or backend.cudnn_available())
  impl = _IMPLS[name]
  if impl.blocks:
    kwargs.update(block_q=block_q, block_kv=block_kv)
  if not impl.per_shard:
    return impl.fn(q_BLHK, k_BSGK, v_BSGK, scale=scale, **kwargs)

  def shard_fn(q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, sinks_H):
    return impl.fn(q_BLHK, k_BSGK, v_BSGK, scale=scale,
                   **dict(kwargs, segment_ids_BL=segment_ids_BL,
                          sinks_H=sinks_H))

  return backend.per_shard_attention(shard_fn, q_BLHK, k_BSGK, v_BSGK,
                                     segment_ids_BL, sinks_H)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kernel:
  """The `attention_kernel` config section: `attention` with `impl`, the
  blocks and the context parallelism bound, called with the signature of
  `attention.reference_attention` by the layers. Not architecture: a model
  gives the same outputs with any of them (`maxtext.models.execution`).
  Compares by value, so models built twice from one config have equal
  static structure.

  Attributes:
    impl: One of `IMPLS` (module docstring).
    block_q: Query tile of "blockwise", "splash" and "pallas_gpu".
    block_kv: Key tile of the same.
    context_parallel: One of `CONTEXT_PARALLELS`: how training attention
      runs when the compute rules split the length (the `sequence` mesh
      axis).
    linear_chunk: Tokens per chunk of the chunked gated delta rule (linear
      attention layers: `maxtext.kernels.gated_delta_rule.chunked`).
  """
  impl: str = "auto"
  block_q: int = 512
  block_kv: int = 512
  context_parallel: str = "allgather"
  linear_chunk: int = 64

  def __post_init__(self):
    sections.check_choice("attention_kernel.impl", self.impl, IMPLS)
    sections.check_int("attention_kernel.block_q", self.block_q, minimum=1)
    sections.check_int("attention_kernel.block_kv", self.block_kv, minimum=1)
    sections.check_choice("attention_kernel.context_parallel",
                          self.context_parallel, CONTEXT_PARALLELS)
    sections.check_int("attention_kernel.linear_chunk", self.linear_chunk,
                       minimum=1)

  def __call__(self, q_BLHK: jax.Array, k_BSGK: jax.Array, v_BSGK: jax.Array,
               **kwargs) -> jax.Array:
    return attention(q_BLHK, k_BSGK, v_BSGK, impl=self.impl,
                     block_q=self.block_q, block_kv=self.block_kv,
                     context_parallel=self.context_parallel, **kwargs)
