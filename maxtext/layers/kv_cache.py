"""Key/value cache of one attention layer, for decoding token by token.

A full-length cache: slot j holds the key and value of position j, for
positions 0..S-1 of every row. Sliding-window layers keep the full cache and
mask keys outside the window (`maxtext.kernels.attention.positions_mask`).
Rows may be at different positions (batched prompts of different lengths):
each row writes its new keys at its own position.

Shape key: B batch, L new tokens, S cache length, G key/value heads, K head
dim.
"""

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys and values [B, S, G, K] by position."""

  key_BSGK: jax.Array
  value_BSGK: jax.Array

  @classmethod
  def zeros(cls, batch: int, length: int, num_kv_heads: int, head_dim: int,
            dtype) -> "KVCache":
    shape = (batch, length, num_kv_heads, head_dim)
    return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

  @property
  def length(self) -> int:
    return self.key_BSGK.shape[-3]

  def write(self, k_BLGK: jax.Array, v_BLGK: jax.Array,
            start_B: jax.Array) -> "KVCache":
    """The cache with row b's L new entries at slots start_B[b]...

    The caller keeps `start_B + L <= S` (`dynamic_update_slice` would clamp
    the start otherwise).
    """
    def write_row(cache_SGK, new_LGK, start):
      return jax.lax.dynamic_update_slice(
          cache_SGK, new_LGK.astype(cache_SGK.dtype), (start, 0, 0))

    write = jax.vmap(write_row)
    return KVCache(write(self.key_BSGK, k_BLGK, start_B),
                   write(self.value_BSGK, v_BLGK, start_B))


def check_decode_args(segment_ids_BL, positions_BL) -> None:
  """Decoding with a KV cache takes positions and no segment ids."""
  if segment_ids_BL is not None or positions_BL is None:
    raise ValueError("Decoding with a KV cache needs positions_BL and "
                     "takes no segment_ids_BL.")
