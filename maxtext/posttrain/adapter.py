"""The one adapter between our models and Tunix's trainers.

Tunix's trainers (`PeftTrainer`, `DPOTrainer`/ORPO, `DistillationTrainer`)
call a model as

  logits, cache = model(input_tokens, positions, cache, attention_mask)

with a boolean attention mask [B, L, L]. `TunixModel` wraps any model of
`maxtext.models.registry` (every family goes through it) and turns that mask
into the segment ids our decoder takes: a token is in segment 0 when it may
not attend to itself (padding), and it starts a new segment when it may
attend to no earlier token. That reproduces exactly the masks our attention
supports, "causal within segments, padding excluded": Tunix's
`make_causal_attn_mask(input_mask)` (left- or right-padded, even with
padding in the middle: the valid tokens form one segment) and block-diagonal
causal masks of packed rows. Outputs at padding positions attend to other
padding instead of the valid tokens; losses never read them.

Our own trainers skip the [B, L, L] mask and pass `segment_ids` directly
(packed rows from `maxtext.data.pipeline`). Activations are constrained by
the compute rules given at construction (`axes.activation_sharding`).

Decoding with Tunix's KV cache is not supported (generation goes through
`maxtext.inference.generate` on the exported checkpoint): a cache argument
is an error.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.sharding import rules as rules_lib


def segment_ids_from_attention_mask(mask_BLL: jax.Array) -> jax.Array:
  """Segment ids [B, L] (int32, 0 on padding) of a causal-within-segments
  attention mask (True where query i may attend to key j)."""
  mask_BLL = mask_BLL.astype(bool)
  length = mask_BLL.shape[-1]
  valid_BL = jnp.diagonal(mask_BLL, axis1=-2, axis2=-1)
  earlier_LL = jnp.tril(jnp.ones((length, length), bool), k=-1)
  continues_BL = jnp.any(mask_BLL & earlier_LL, axis=-1)
  starts_BL = valid_BL & ~continues_BL
  return (jnp.cumsum(starts_BL, axis=-1) * valid_BL).astype(jnp.int32)


class TunixModel(nnx.Module):
  """A model of our library with Tunix's call signature.

  Attributes:
    model: The wrapped decoder (its parameters, LoRA ones included, are this
      module's).
    rules: Compute layout of activations; None leaves them unconstrained.
  """

  def __init__(self, model: nnx.Module,
               rules: rules_lib.LogicalRules | None = None):
    self.model = model
    self.rules = rules

  def __call__(self, input_tokens: jax.Array,
               positions: jax.Array | None = None, cache=None,
               attention_mask: jax.Array | None = None, *,
               segment_ids: jax.Array | None = None,
               images: jax.Array | None = None):
    """Returns (float32 logits [B, L, V], None).

    Args:
      input_tokens: Token ids [B, L].
      positions: Rotary position of each token [B, L]; None means 0..L-1.
      cache: Must be None (see the module docstring).
      attention_mask: Boolean [B, L, L], causal within segments (see the
        module docstring); None means causal over the whole row.
      segment_ids: Packed-sequence ids [B, L] (0 on padding), instead of
        `attention_mask`.
      images: A vision-language model's images [B, v, h, w, 3] for the
        placeholders of `input_tokens`.

    Raises:
      ValueError: a cache is given, or both a mask and segment ids.
    """
    if cache is not None:
      raise ValueError(
          "TunixModel does not decode with a Tunix KV cache; generate from"
          " the exported checkpoint with maxtext.inference.generate"
          " (//maxtext/bin:decode).")
    if attention_mask is not None:
      if segment_ids is not None:
        raise ValueError("Give attention_mask or segment_ids, not both.")
      segment_ids = segment_ids_from_attention_mask(attention_mask)
    with axes.activation_sharding(self.rules):
      logits_BLV = self.model(input_tokens, positions_BL=positions,
                              segment_ids_BL=segment_ids,
                              **({} if images is None else
                                 {"images_Bvhwe": images}))
    return logits_BLV, None
