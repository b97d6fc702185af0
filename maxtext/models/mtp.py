"""Multi-token prediction (MTP, DeepSeek-V3): extra depths of prediction.

The module of depth k (1-based) combines, at each position i, the hidden
state h^{k-1}_i of the previous depth (h^0: the main model's output after
its final norm, as vLLM's DeepSeek MTP takes it) with the embedding of token
i + k:

  h^k_i = Block(W [RMSNorm_e(Emb(t_{i+k})); RMSNorm_h(h^{k-1}_i)])

(one transformer block of the main model's kind, causal over positions),
and predicts token i + k + 1 with the main model's output head applied to
its own final norm of h^k_i. The embedding and output head are shared with
the main model. The last k positions have no token i + k (token 0 is
embedded there); their loss mask (`mtp_targets`) drops them.

In training the decoder sows each depth's logits as `MtpLogits`; the train
step collects them with `nnx.capture` and adds `mtp_loss_weight` times the
mean over depths of each depth's cross-entropy against `mtp_targets` to the
objective (`train/mtp_loss`).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Callable, Sequence
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import sections
from maxtext.layers import linear
from maxtext.layers import norm
from maxtext.layers import rope


@dataclasses.dataclass(frozen=True, kw_only=True)
class MtpConfig:
  """A model's multi-token prediction (`ModelConfig.mtp`).

  Attributes (their `model` section keys in `KEYS`):
    layers: Prediction depths, each one `MTP` module; 0 is off.
    loss_weight: Weight of the mean over depths of their cross-entropy in
      the training objective.
  """

  KEYS: ClassVar[dict[str, str]] = {"layers": "mtp_layers",
                                    "loss_weight": "mtp_loss_weight"}

  layers: int = 0
  loss_weight: float = 0.0

  def __post_init__(self):
    value = self.layers
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      sections.fail_part(self, "layers", "must be an integer >= 0 (0 is off)")
    if self.loss_weight < 0:
      sections.fail_part(self, "loss_weight", "must be >= 0")


class MtpLogits(nnx.Intermediate):
  """Each prediction depth's float32 logits [B, L, V] (sown in training)."""


class MTP(nnx.Module):
  """One prediction depth: norms, projection of the concatenation, block."""

  def __init__(self, block: nnx.Module, *, embed_dim: int,
               norm_config: norm.NormConfig, dtype: str, param_dtype: str,
               rngs: nnx.Rngs):
    def embed_norm():
      return norm_config.rms_norm(embed_dim, axis_name=axes.EMBED,
                                  param_dtype=param_dtype)

    self.embed_norm = embed_norm()
    self.hidden_norm = embed_norm()
    self.projection = linear.Linear(
        (2 * embed_dim,), (embed_dim,), in_axes=(axes.EMBED,),
        out_axes=(axes.EMBED,), dtype=dtype, param_dtype=param_dtype,
        rngs=rngs)
    self.block = block
    self.final_norm = embed_norm()

  def __call__(self, h_BLD: jax.Array, embedded_BLD: jax.Array,
               rotary: rope.Rotary, positions_BL: jax.Array | None,
               segment_ids_BL: jax.Array | None
               ) -> tuple[jax.Array, dict | None]:
    """(h^k [B, L, D], the block's aux dict or None: its experts' values
    and its indexer's loss, `block.Block`) from h^{k-1} and
    the embeddings of the tokens k ahead."""
    x_BLD = self.projection(jnp.concatenate(
        [self.embed_norm(embedded_BLD), self.hidden_norm(h_BLD)], axis=-1))
    x_BLD, _, aux, _ = self.block(x_BLD, rotary, window=None,
                                  segment_ids_BL=segment_ids_BL,
                                  positions_BL=positions_BL, index_loss=True)
    return x_BLD, aux


def predict(modules: Sequence[MTP], tokens_BL: jax.Array, h_BLD: jax.Array,
            rotary: rope.Rotary, positions_BL: jax.Array,
            segment_ids_BL: jax.Array | None,
            embed: Callable[[jax.Array], jax.Array],
            logits: Callable[[jax.Array], jax.Array],
            ) -> tuple[list[jax.Array], list[dict | None]]:
  """Each depth's logits [B, L, V] and block aux (module doc).

  Args:
    modules: The depths in order.
    tokens_BL: The main model's input tokens.
    h_BLD: The main model's output hidden states (after its final norm).
    rotary: The main model's rotary (at `positions_BL`).
    positions_BL: The tokens' positions.
    segment_ids_BL: Packed-sequence ids, or None.
    embed: The shared token embedding.
    logits: The shared output head (float32 logits of normalised states).
  """
  all_logits, auxes = [], []
  for depth, module in enumerate(modules, 1):
    ahead_BL = jnp.pad(tokens_BL[:, depth:], ((0, 0), (0, depth)))
    h_BLD, aux = module(h_BLD, embed(ahead_BL), rotary, positions_BL,
                        segment_ids_BL)
    all_logits.append(logits(module.final_norm(h_BLD)))
    auxes.append(aux)
  return all_logits, auxes


def mtp_targets(depth: int, targets_BL: jax.Array, mask_BL: jax.Array,
                segment_ids_BL: jax.Array | None
                ) -> tuple[jax.Array, jax.Array]:
  """Targets and mask [B, L - depth] of depth `depth`'s first L - depth
  positions: position i predicts targets[i + depth] (token i + depth + 1),
  counted where that target counts and lies in position i's segment."""
  mask_BL = mask_BL[:, depth:]
  if segment_ids_BL is not None:
    mask_BL = mask_BL * (segment_ids_BL[:, depth:] ==
                         segment_ids_BL[:, :-depth])
  return targets_BL[:, depth:], mask_BL
