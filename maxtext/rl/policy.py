"""The model every RL role holds: our decoder behind the Tunix adapter, with
the call signature Tunix's RL code expects.

Tunix's RL losses and log-prob helpers (`tunix.rl.common
.compute_per_token_logps`) pass a [B, L, L] attention mask and, when the
model's signature names `segment_ids`, also the per-token non-padding mask
of the left-padded prompt + right-padded completion as `segment_ids`. That
mask (1 on real tokens, 0 on padding) is already our segment-id convention
(one segment, padding excluded), so `PolicyModel` (a `TunixModel`) passes
it on and drops the [B, L, L] mask; without segment ids it converts the
mask as `TunixModel` does.

`RlTokenizer` gives our tokenizers the methods Tunix's `TokenizerAdapter`
calls (`encode`, `decode`, `bos_id()`, `eos_id()`, `pad_id()`).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from flax import nnx
import jax

from maxtext.data import tokenizer as tokenizer_lib
from maxtext.posttrain import adapter

# Pad tokens looked up in the vocabulary; without one the EOS pads.
_PAD_TOKENS = ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>")


class PolicyModel(adapter.TunixModel):
  """A `TunixModel` for Tunix's RL roles (actor, reference, rollout); it
  wraps the same decoder object as the `TunixModel` it is built from."""

  @classmethod
  def of(cls, model: adapter.TunixModel) -> "PolicyModel":
    """The policy around `model`'s decoder (shared, not copied)."""
    return cls(model.model, model.rules)

  @property
  def decoder(self) -> nnx.Module:
    """The decoder itself (what `maxtext.inference.generate` runs)."""
    return self.model

  def __call__(self, input_tokens: jax.Array,
               positions: jax.Array | None = None, cache=None,
               attention_mask: jax.Array | None = None, *,
               segment_ids: jax.Array | None = None):
    """Returns (float32 logits [B, L, V], None); see the module docstring."""
    if segment_ids is not None:
      attention_mask = None
    return super().__call__(input_tokens, positions, cache, attention_mask,
                            segment_ids=segment_ids)


class RlTokenizer:
  """One of our tokenizers with Tunix's tokenizer methods.

  Attributes:
    tokenizer: The wrapped `maxtext.data.tokenizer.Tokenizer`.
  """

  def __init__(self, tokenizer: tokenizer_lib.Tokenizer):
    if tokenizer.eos_id is None:
      raise ValueError(
          "The tokenizer has no EOS token; RL rollouts stop at it (add one"
          " to the tokenizer or use another).")
    self.tokenizer = tokenizer
    self._pad_id = tokenizer.eos_id
    for token in _PAD_TOKENS:
      ids = tokenizer.encode(token, allow_special=True)
      if len(ids) == 1 and tokenizer.special_text(ids[0]) == token:
        self._pad_id = ids[0]
        break

  def encode(self, text: str, **unused) -> list[int]:
    del unused
    return self.tokenizer.encode(text, allow_special=True)

  def decode(self, ids, **unused) -> str:
    del unused
    return self.tokenizer.decode([int(i) for i in ids])

  def bos_id(self) -> int | None:
    return self.tokenizer.bos_id

  def eos_id(self) -> int:
    return self.tokenizer.eos_id

  def pad_id(self) -> int:
    """"<pad>" (or another pad token) when the vocabulary has one, else the
    EOS (Tunix's convention for Hugging Face tokenizers)."""
    return self._pad_id
