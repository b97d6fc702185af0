"""Gated DeltaNet: linear attention with a state per head instead of a KV
cache (Qwen3-Next, Qwen3.5: `LinearAttentionConfig`; the rule itself is
`maxtext.kernels.gated_delta_rule`).

  q, k, v = silu(causal_conv(project(x)))      short depthwise convolutions
  q, k = l2_normalize(q, k); q *= K^-1/2       G key heads, repeated to the
                                               H value heads
  beta = sigmoid(x W_beta)                     write strength per head
  g = -exp(log_rate) * softplus(x W_decay + decay_bias)   log-decay <= 0
  o = gated_delta_rule(q, k, v, g, beta)
  out = (rms_norm(o) * silu(x W_gate)) W_out   per value head

Training and prefill run the chunked rule (`attention_kernel.linear_chunk`
tokens a chunk); packed sequences (`segment_ids_BL`) restart the state and
the convolutions at each segment. Decoding carries a `DeltaNetCache` (the
convolutions' last inputs and the state) in place of a KV cache: a one-token
call runs the recurrent form (`gated_delta_rule.step`), a longer one (a
prompt) the chunked form from the cached state. A prompt's right padding
(`valid_BL` False) leaves the cache as it was after the row's last real
token.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY` (G key heads, H value heads,
K key head dim, U value head dim, y the convolution's state).
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import sections
from maxtext.kernels import dispatch
from maxtext.kernels import gated_delta_rule
from maxtext.layers import linear
from maxtext.layers import norm


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearAttentionConfig:
  """A model's Gated DeltaNet layers (`ModelConfig.linear_attention`).

  Attributes (their `model` section keys in `KEYS`):
    num_key_heads: Query/key heads of a linear layer; 0: no linear layers
      (every layer is full attention).
    num_value_heads: Value heads (the rule's heads); a multiple of
      num_key_heads.
    key_head_dim, value_head_dim: Widths of one key and one value head.
    conv_taps: Width of the causal depthwise convolutions over q, k, v.
    full_attention_interval: With linear layers, layer i (0-based) is full
      attention when `(i + 1) % full_attention_interval == 0` and linear
      otherwise; 0: every layer is linear.
  """

  KEYS: ClassVar[dict[str, str]] = {
      "num_key_heads": "linear_num_key_heads",
      "num_value_heads": "linear_num_value_heads",
      "key_head_dim": "linear_key_head_dim",
      "value_head_dim": "linear_value_head_dim",
      "conv_taps": "linear_conv_taps",
      "full_attention_interval": "full_attention_interval",
  }

  num_key_heads: int = 0
  num_value_heads: int = 0
  key_head_dim: int = 128
  value_head_dim: int = 128
  conv_taps: int = 4
  full_attention_interval: int = 4

  def __post_init__(self):
    def fail(field, valid):
      sections.fail_part(self, field, valid)

    for name in ("num_key_heads", "num_value_heads",
                 "full_attention_interval"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(name, "must be an integer >= 0")
    for name in ("key_head_dim", "value_head_dim", "conv_taps"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(name, "must be a positive integer")
    if not self.num_key_heads:
      if self.num_value_heads:
        fail("num_key_heads", "must be positive when "
             f"linear_num_value_heads={self.num_value_heads}")
      return
    if self.num_value_heads < 1 or self.num_value_heads % self.num_key_heads:
      fail("num_value_heads", "must be a positive multiple of "
           f"linear_num_key_heads={self.num_key_heads}")

  def linear_layers(self, num_layers: int) -> tuple[bool, ...]:
    """Whether each layer is a Gated DeltaNet layer."""
    interval = self.full_attention_interval
    return tuple(bool(self.num_key_heads) and not (
        interval and (i + 1) % interval == 0) for i in range(num_layers))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DeltaNetCache:
  """What a Gated DeltaNet layer carries between decoding calls: the last
  `conv_taps - 1` inputs of each convolution and the state (float32)."""

  query_BYGK: jax.Array
  key_BYGK: jax.Array
  value_BYHU: jax.Array
  state_BHKU: jax.Array

  @classmethod
  def zeros(cls, cfg: LinearAttentionConfig, batch: int,
            dtype) -> "DeltaNetCache":
    taps = cfg.conv_taps - 1
    keys = (batch, taps, cfg.num_key_heads, cfg.key_head_dim)
    return cls(jnp.zeros(keys, dtype), jnp.zeros(keys, dtype),
               jnp.zeros((batch, taps, cfg.num_value_heads,
                          cfg.value_head_dim), dtype),
               jnp.zeros((batch, cfg.num_value_heads, cfg.key_head_dim,
                          cfg.value_head_dim), jnp.float32))


def causal_conv(x_BLNK: jax.Array, weight_NKy: jax.Array, *,
                segment_ids_BL: jax.Array | None = None,
                state_ByNK: jax.Array | None = None) -> jax.Array:
  """Depthwise causal convolution then silu: out_t = silu(sum_j w[j] x[t -
  taps + 1 + j]) per channel (N heads of width K), inputs of another
  segment (or before the start, unless `state_ByNK` holds them) zero."""
  taps = weight_NKy.shape[-1]
  length = x_BLNK.shape[1]
  if state_ByNK is None:
    state_ByNK = jnp.zeros((x_BLNK.shape[0], taps - 1, *x_BLNK.shape[2:]),
                           x_BLNK.dtype)
  ext_BxNK = jnp.concatenate([state_ByNK.astype(x_BLNK.dtype), x_BLNK], axis=1)
  weight_yNK = jnp.moveaxis(weight_NKy, -1, 0).astype(jnp.float32)
  out_BLNK = jnp.zeros(x_BLNK.shape, jnp.float32)
  for tap in range(taps):
    shift = taps - 1 - tap
    window_BLNK = ext_BxNK[:, tap:tap + length].astype(jnp.float32)
    if shift and segment_ids_BL is not None:
      before_BL = jnp.pad(segment_ids_BL, [(0, 0), (shift, 0)],
                          constant_values=-1)[:, :length]
      window_BLNK = jnp.where((before_BL == segment_ids_BL)[..., None, None],
                              window_BLNK, 0.0)
    out_BLNK = out_BLNK + window_BLNK * weight_yNK[tap]
  return jax.nn.silu(out_BLNK).astype(x_BLNK.dtype)


def _conv_state(x_BLNK, state_ByNK, valid_B):
  """The last `y` inputs of each row up to its `valid_B` real tokens."""
  taps = state_ByNK.shape[1]
  ext_BxNK = jnp.concatenate([state_ByNK, x_BLNK.astype(state_ByNK.dtype)],
                             axis=1)
  return jax.vmap(lambda row, start: jax.lax.dynamic_slice_in_dim(
      row, start, taps, axis=0))(ext_BxNK, valid_B)


def _l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
  """x / sqrt(sum(x^2) + eps) over the last axis, float32."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


class GatedDeltaNet(nnx.Module):
  """A Gated DeltaNet layer [B, L, D] -> [B, L, D] (module docstring).

  Parameters (Hugging Face names in `maxtext.models.qwen3_next`): `query`,
  `key` [D, G, K], `value`, `gate` [D, H, U], `beta`, `decay` [D, H], the
  convolutions `query_conv`, `key_conv` [G, K, taps] and `value_conv`
  [H, U, taps], `decay_bias` and `log_rate` [H], the output norm's `norm`
  [U] and `output` [H, U, D].
  """

  def __init__(self, cfg: LinearAttentionConfig, *, embed_dim: int,
               norm_eps: float, dtype: str, param_dtype: str,
               kernel: dispatch.Kernel = dispatch.Kernel(), rngs: nnx.Rngs):
    def project(out_shape, out_axes):
      return linear.Linear((embed_dim,), out_shape, in_axes=(axes.EMBED,),
                           out_axes=out_axes, dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs)

    keys, values = cfg.num_key_heads, cfg.num_value_heads
    key_shape, value_shape = (keys, cfg.key_head_dim), (values,
                                                        cfg.value_head_dim)
    key_axes = (axes.KV_HEADS, axes.HEAD_DIM)
    value_axes = (axes.HEADS, axes.HEAD_DIM)
    self.query = project(key_shape, key_axes)
    self.key = project(key_shape, key_axes)
    self.value = project(value_shape, value_axes)
    self.gate = project(value_shape, value_axes)
    self.beta = project((values,), (axes.HEADS,))
    self.decay = project((values,), (axes.HEADS,))
    param_dtype = jnp.dtype(param_dtype)
    bound = cfg.conv_taps**-0.5  # torch Conv1d's default for one channel.

    def conv(shape, names):
      return axes.param(jax.random.uniform(
          rngs.params(), (*shape, cfg.conv_taps), param_dtype, -bound,
          bound), (*names, None))

    self.query_conv = conv(key_shape, key_axes)
    self.key_conv = conv(key_shape, key_axes)
    self.value_conv = conv(value_shape, value_axes)
    self.decay_bias = axes.param(jnp.ones((values,), param_dtype),
                                 (axes.HEADS,))
    self.log_rate = axes.param(jnp.log(jax.random.uniform(
        rngs.params(), (values,), param_dtype, 1.0, 16.0)), (axes.HEADS,))
    self.norm = norm.RMSNorm(cfg.value_head_dim, axis_name=axes.HEAD_DIM,
                             eps=norm_eps, offset=0.0,
                             param_dtype=param_dtype.name)
    self.output = linear.Linear(value_shape, (embed_dim,), in_axes=value_axes,
                                out_axes=(axes.EMBED,), dtype=dtype,
                                param_dtype=param_dtype.name, rngs=rngs)
    self.chunk = kernel.linear_chunk
    self.dtype = jnp.dtype(dtype)

  def __call__(self, x_BLD: jax.Array, *,
               segment_ids_BL: jax.Array | None = None,
               cache: DeltaNetCache | None = None,
               valid_BL: jax.Array | None = None
               ) -> jax.Array | tuple[jax.Array, DeltaNetCache]:
    """The layer's output, and with `cache` the cache after these tokens
    (`valid_BL`: which are real, a prefix of each row; None: all).
    Packed sequences (`segment_ids_BL`) take no cache."""
    if cache is not None and segment_ids_BL is not None:
      raise ValueError("A Gated DeltaNet layer with a cache takes no "
                       "segment_ids_BL (one sequence per row).")
    batch, length, _ = x_BLD.shape
    # The convolution and the delta rule run over the whole length: a
    # sequence-sharded length is gathered around them (`whole`), and the
    # output goes back to `names`.
    names = (axes.BATCH, axes.LENGTH)
    whole = (axes.BATCH, axes.KV_LENGTH)
    if segment_ids_BL is not None:
      segment_ids_BL = axes.constrain(segment_ids_BL, whole)
    raw = [axes.constrain(x, whole + (axes.KV_HEADS if i < 2 else axes.HEADS,
                                      axes.HEAD_DIM))
           for i, x in enumerate((self.query(x_BLD), self.key(x_BLD),
                                  self.value(x_BLD)))]
    convs = (self.query_conv, self.key_conv, self.value_conv)
    states = ((None,) * 3 if cache is None else
              (cache.query_BYGK, cache.key_BYGK, cache.value_BYHU))
    q_BLGK, k_BLGK, v_BLHU = (
        axes.constrain(causal_conv(x, w[...], segment_ids_BL=segment_ids_BL,
                                   state_ByNK=s),
                       whole + (axes.KV_HEADS if i < 2 else axes.HEADS,
                                axes.HEAD_DIM))
        for i, (x, w, s) in enumerate(zip(raw, convs, states)))
    repeats = v_BLHU.shape[2] // q_BLGK.shape[2]
    q_BLHK, k_BLHK = (jnp.repeat(_l2_normalize(x), repeats, axis=2)
                      for x in (q_BLGK, k_BLGK))
    q_BLHK = q_BLHK * q_BLHK.shape[-1]**-0.5
    beta_BLH = jax.nn.sigmoid(self.beta(x_BLD).astype(jnp.float32))
    g_BLH = -jnp.exp(self.log_rate[...].astype(jnp.float32)) * (
        jax.nn.softplus(self.decay(x_BLD).astype(jnp.float32) +
                        self.decay_bias[...].astype(jnp.float32)))
    g_BLH, beta_BLH = (axes.constrain(x, whole + (axes.HEADS,))
                       for x in (g_BLH, beta_BLH))
    if cache is None:
      o_BLHU, _ = gated_delta_rule.chunked(
          q_BLHK, k_BLHK, v_BLHU, g_BLH, beta_BLH, chunk=self.chunk,
          segment_ids_BL=segment_ids_BL)
    else:
      if valid_BL is None:
        valid_BL = jnp.ones((batch, length), bool)
      # Padding leaves the state as it is: no decay, no write.
      beta_BLH = jnp.where(valid_BL[..., None], beta_BLH, 0.0)
      g_BLH = jnp.where(valid_BL[..., None], g_BLH, 0.0)
      if length == 1:
        o_BHU, state_BHKU = gated_delta_rule.step(
            cache.state_BHKU, q_BLHK[:, 0].astype(jnp.float32),
            k_BLHK[:, 0].astype(jnp.float32),
            v_BLHU[:, 0].astype(jnp.float32), g_BLH[:, 0], beta_BLH[:, 0])
        o_BLHU = o_BHU[:, None]
      else:
        o_BLHU, state_BHKU = gated_delta_rule.chunked(
            q_BLHK, k_BLHK, v_BLHU, g_BLH, beta_BLH, chunk=self.chunk,
            state_BHKU=cache.state_BHKU)
      valid_B = jnp.sum(valid_BL, axis=1, dtype=jnp.int32)
      cache = DeltaNetCache(*(_conv_state(x, s, valid_B)
                              for x, s in zip(raw, states)), state_BHKU)
    o_BLHU = axes.constrain(
        axes.constrain(o_BLHU, whole + (axes.HEADS, axes.HEAD_DIM)).astype(
            self.dtype), names + (axes.HEADS, axes.HEAD_DIM))
    gate_BLHU = jax.nn.silu(self.gate(x_BLD).astype(jnp.float32))
    o_BLHU = (self.norm(o_BLHU).astype(jnp.float32) * gate_BLHU).astype(
        self.dtype)
    out_BLD = self.output(o_BLHU)
    return out_BLD if cache is None else (out_BLD, cache)
