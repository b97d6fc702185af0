"""What both rollout engines (`jax_rollout`, `vllm_rollout`) share.

`PolicyRollout` is Tunix's `BaseRollout` plus the parts that do not depend
on the engine: prompt encoding (the last `max_prompt_length` tokens of each
prompt, none empty), the left-padded prompt array of `RolloutOutput`, and
completion scoring with the rollout's copy of the policy at the sampling
temperature (as the learner scores them). An engine sets `self._policy`
(the policy model it scores with), `self._tokenizer` (Tunix's
`TokenizerAdapter`), `self._config` (the rollout config) and `self.mesh`
(None or the mesh the policy lives on).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from typing import Any

from flax import nnx
import jax
import numpy as np
from tunix.rl import common
from tunix.rl.rollout import base_rollout


class PolicyRollout(base_rollout.BaseRollout):
  """The engine-independent half of a rollout engine.

  Attributes:
    last_lengths: Tokens of each completion of the latest `generate` (its
      stop token included), for length-based rewards.
    last_seconds: Wall time of the latest `generate`'s sampling
      (compilation included when it compiled).
    last_tokens_per_s: Its generated tokens per second.
  """

  mesh: jax.sharding.Mesh | None = None
  last_lengths: tuple[int, ...] = ()
  last_seconds: float = 0.0
  last_tokens_per_s: float = 0.0
  _policy: nnx.Module
  _tokenizer: Any
  _config: base_rollout.RolloutConfig

  def _encode_prompts(self, prompts: list[str],
                      max_prompt: int) -> list[list[int]]:
    """Token ids of each prompt: its last `max_prompt` tokens.

    Raises:
      ValueError: a prompt encodes to no tokens.
    """
    prompt_ids = [self._tokenizer.encode(p)[-max_prompt:] for p in prompts]
    if any(not ids for ids in prompt_ids):
      raise ValueError("A prompt encodes to no tokens; every prompt needs"
                       " at least one.")
    return prompt_ids

  def _left_padded(self, prompt_ids: list[list[int]],
                   max_prompt: int) -> np.ndarray:
    """The prompts left-padded with the padding id, [B, max_prompt]."""
    prompts_BL = np.full((len(prompt_ids), max_prompt), self.pad_id(),
                         np.int32)
    for row, ids in enumerate(prompt_ids):
      prompts_BL[row, max_prompt - len(ids):] = ids
    return prompts_BL

  def _output(self, tokens: list[np.ndarray], texts: list[str],
              logprobs: Any, prompt_ids: list[list[int]],
              max_prompt: int, seconds: float) -> base_rollout.RolloutOutput:
    """The `RolloutOutput` of a `generate` whose sampling took `seconds`;
    keeps its completions' lengths and speed (`last_*`)."""
    self.last_lengths = tuple(len(t) for t in tokens)
    self.last_seconds = seconds
    self.last_tokens_per_s = sum(self.last_lengths) / max(seconds, 1e-9)
    return base_rollout.RolloutOutput(
        text=texts, logits=None, tokens=tokens,
        left_padded_prompt_tokens=self._left_padded(prompt_ids, max_prompt),
        logprobs=logprobs)

  def _text(self, token_ids: list[int], stop_ids) -> str:
    """The text of a completion, without its stop token."""
    if token_ids and token_ids[-1] in stop_ids:
      token_ids = token_ids[:-1]
    return self._tokenizer.decode(token_ids)

  def get_per_token_logps(self, prompt_tokens: jax.Array,
                          completion_tokens: jax.Array) -> jax.Array:
    """Log-probs [B, C] of `completion_tokens` after the left-padded
    `prompt_tokens` [B, P] under the rollout's weights, at the sampling
    temperature."""
    graphdef, state = nnx.split(self._policy)
    if self.mesh is not None and not self.mesh.empty:
      prompt_tokens, completion_tokens = jax.device_put(
          (prompt_tokens, completion_tokens), jax.sharding.NamedSharding(
              self.mesh, jax.sharding.PartitionSpec()))
    temperature = self._config.temperature
    return common.compute_per_token_logps(
        graphdef, state, prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens, pad_id=self.pad_id(),
        eos_id=self.eos_id(), stop_gradient=True,
        temperature=float(temperature) if temperature > 0 else 1.0)

  def pad_id(self) -> int:
    return self._tokenizer.pad_id()

  def eos_id(self) -> int:
    return self._tokenizer.eos_id()

  def model(self) -> nnx.Module:
    return self._policy
