"""Log-likelihoods of token continuations under a decoder, in batches.

A request is (context ids, continuation ids). Its score is the sum over the
continuation's tokens of log p(token | every token before it), and whether
every continuation token is the model's most likely next token (greedy).

Requests are sorted longest first, right-padded to a power-of-two length
bucket and scored one forward pass per batch of `batch_size` rows (no KV
cache; attention is causal, so padding after a row's tokens cannot change
them). The last batch is padded with empty rows, so there is one compilation
per length bucket. A request longer than `max_length` keeps its last
`max_length` tokens, as lm-eval's models do.

`score_rolling` scores whole documents: each is cut into lm-eval's rolling
windows of at most `max_length` tokens, so every token is predicted exactly
once, the first conditioned on a prefix token (BOS or EOS).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Sequence
import functools

from flax import nnx
import jax
import jax.numpy as jnp
from lm_eval import utils as lm_eval_utils
import numpy as np

# Shortest length bucket: shorter buckets would compile more for no gain.
_MIN_BUCKET = 16


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _target_logprobs(graphdef, state, inputs_BL, targets_BL):
  """float32 log p(target) [B, L] and whether it is the argmax [B, L]."""
  model = nnx.merge(graphdef, state)
  logits_BLV = model(inputs_BL)
  target_BL = jnp.take_along_axis(logits_BLV, targets_BL[..., None],
                                  axis=-1)[..., 0]
  logprobs_BL = target_BL - jax.nn.logsumexp(logits_BLV, axis=-1)
  greedy_BL = jnp.argmax(logits_BLV, axis=-1) == targets_BL
  return logprobs_BL, greedy_BL


def rolling_windows(tokens: Sequence[int], *, prefix_id: int,
                    max_length: int) -> list[tuple[list[int], list[int]]]:
  """lm-eval's disjoint rolling windows of a document, as requests.

  Args:
    tokens: The document's token ids (no BOS).
    prefix_id: The token the first window is conditioned on.
    max_length: Most tokens one forward pass sees.

  Returns:
    (context, continuation) pairs; the continuations together are `tokens`.
  """
  return [lm_eval_utils.make_disjoint_window(window)
          for window in lm_eval_utils.get_rolling_token_windows(
              token_list=list(tokens), prefix_token=prefix_id,
              max_seq_len=max_length, context_len=1)]


class Scorer:
  """Scores requests with a decoder (`maxtext.models.decoder.Decoder`).

  Attributes:
    max_length: Most tokens of one request the model sees.
    batch_size: Requests per forward pass.
  """

  def __init__(self, model: nnx.Module, *, max_length: int, batch_size: int):
    if max_length < 2:
      raise ValueError(f"max_length={max_length} must be >= 2.")
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size} must be >= 1.")
    self.max_length = max_length
    self.batch_size = batch_size
    self._graphdef, self._state = nnx.split(model)

  def _bucket(self, length: int) -> int:
    return min(self.max_length,
               max(_MIN_BUCKET, 1 << (length - 1).bit_length()))

  def score(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
            ) -> list[tuple[float, bool]]:
    """(sum of continuation log-probs, whether all are greedy) per request.

    Raises:
      ValueError: a request has no context or continuation token, or a
        continuation longer than `max_length` (names the request).
    """
    rows = []  # (inputs, targets, number of scored targets at the end)
    for index, (context, continuation) in enumerate(requests):
      if not context or not continuation:
        raise ValueError(
            f"Request {index} has {len(context)} context and"
            f" {len(continuation)} continuation tokens; each needs at least"
            " one.")
      if len(continuation) > self.max_length:
        raise ValueError(
            f"Request {index} has a continuation of {len(continuation)}"
            f" tokens, more than max_length={self.max_length}.")
      whole = [*context, *continuation][-(self.max_length + 1):]
      rows.append((whole[:-1], whole[1:], len(continuation)))
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    results = [None] * len(rows)
    for start in range(0, len(order), self.batch_size):
      batch = order[start:start + self.batch_size]
      length = self._bucket(len(rows[batch[0]][0]))
      inputs_BL = np.zeros((self.batch_size, length), np.int32)
      targets_BL = np.zeros((self.batch_size, length), np.int32)
      for row, index in enumerate(batch):
        inputs, targets, _ = rows[index]
        inputs_BL[row, :len(inputs)] = inputs
        targets_BL[row, :len(targets)] = targets
      logprobs_BL, greedy_BL = jax.device_get(_target_logprobs(
          self._graphdef, self._state, inputs_BL, targets_BL))
      for row, index in enumerate(batch):
        inputs, _, scored = rows[index]
        span = slice(len(inputs) - scored, len(inputs))
        results[index] = (float(logprobs_BL[row, span].astype(np.float64)
                                .sum()),
                          bool(greedy_BL[row, span].all()))
    return results

  def score_rolling(self, documents: Sequence[Sequence[int]], *,
                    prefix_id: int) -> list[float]:
    """Log-likelihood of each whole document (see `rolling_windows`).

    Raises:
      ValueError: a document has no tokens (names it).
    """
    requests, owners = [], []
    for index, tokens in enumerate(documents):
      if not tokens:
        raise ValueError(f"Document {index} has no tokens.")
      windows = rolling_windows(tokens, prefix_id=prefix_id,
                                max_length=self.max_length)
      requests.extend(windows)
      owners.extend([index] * len(windows))
    totals = [0.0] * len(documents)
    for owner, (logprob, _) in zip(owners, self.score(requests)):
      totals[owner] += logprob
    return totals
