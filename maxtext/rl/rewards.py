"""Reward functions of an RL run: plain Python functions on strings.

A reward function takes the prompts, the completions (decoded text, the
stop token left out) and the data set's other columns as keyword arguments
(e.g. `answer`), and returns one float per completion, as Tunix's
`GRPOLearner` calls it. The config names them in `rl.rewards` as
(name, weight) pairs, the name either one of `REWARDS` or
"package.module:function" for your own; `make_reward_fns` builds the
weighted functions the learner sums.
"""

from collections.abc import Callable, Sequence
import importlib
import re
from typing import Any

RewardFn = Callable[..., list[float]]

# GSM8K's final answer: "#### 42" (commas and a sign allowed).
_ANSWER = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
# The whole completion ends with the final answer.
_FORMAT = re.compile(r"(?s).*####\s*-?[\d,]*\.?\d+\s*")


def _number(text: str) -> float | None:
  try:
    return float(text.replace(",", ""))
  except ValueError:
    return None


def extract_answer(text: str, first: bool = False) -> str | None:
  """The number after the last (`first`: the first) "####" in `text`; None
  without one."""
  found = _ANSWER.findall(text)
  return (found[0] if first else found[-1]) if found else None


def _answers_equal(completions: Sequence[str], answer: Sequence[Any],
                   first: bool) -> list[float]:
  rewards = []
  for completion, reference in zip(completions, answer, strict=True):
    reference = str(reference)
    want = _number(extract_answer(reference) or reference.strip())
    got = extract_answer(completion, first)
    rewards.append(float(want is not None and got is not None and
                         _number(got) == want))
  return rewards


def exact_answer(prompts: Sequence[str], completions: Sequence[str], *,
                 answer: Sequence[Any], **unused) -> list[float]:
  """1 when the completion's final "#### N" equals the reference answer
  (numerically; a reference may itself be a GSM8K solution ending in
  "#### N"), else 0."""
  del prompts, unused
  return _answers_equal(completions, answer, first=False)


def first_answer(prompts: Sequence[str], completions: Sequence[str], *,
                 answer: Sequence[Any], **unused) -> list[float]:
  """1 when the completion's first "#### N" equals the reference answer
  (as lm-eval's GSM8K strict match reads it: what follows the first answer
  does not count), else 0."""
  del prompts, unused
  return _answers_equal(completions, answer, first=True)


def answer_format(prompts: Sequence[str], completions: Sequence[str],
                  **unused) -> list[float]:
  """1 when the completion ends with a final answer "#### N", else 0."""
  del prompts, unused
  return [float(bool(_FORMAT.fullmatch(c))) for c in completions]


def length_penalty(prompts: Sequence[str], completions: Sequence[str], *,
                   max_words: int = 16, **unused) -> list[float]:
  """-(words beyond `max_words`) / `max_words` per completion (0 when
  short enough)."""
  del prompts, unused
  return [-max(0, len(c.split()) - max_words) / max_words
          for c in completions]


def overlong_penalty(prompts: Sequence[str], completions: Sequence[str], *,
                     completion_lengths: Sequence[int], max_length: int,
                     buffer: int, **unused) -> list[float]:
  """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13) of
  completions of `completion_lengths` tokens: 0 up to `max_length -
  buffer` tokens, then ((max_length - buffer) - length) / buffer, reaching
  -1 at `max_length`, and -1 beyond."""
  del prompts, unused
  if len(completion_lengths) != len(completions):
    raise ValueError(f"{len(completion_lengths)} completion lengths for"
                     f" {len(completions)} completions.")
  start = max_length - buffer
  return [0.0 if length <= start else
          (start - length) / buffer if length <= max_length else -1.0
          for length in completion_lengths]


REWARDS: dict[str, RewardFn] = {
    "exact_answer": exact_answer,
    "first_answer": first_answer,
    "answer_format": answer_format,
    "length_penalty": length_penalty,
    "overlong_penalty": overlong_penalty,
}


def reward_function(name: str) -> RewardFn:
  """The function `name`: a key of `REWARDS` or "package.module:function".

  Raises:
    ValueError: `name` is neither (the message lists the built-in names).
  """
  if name in REWARDS:
    return REWARDS[name]
  module_name, _, function_name = name.partition(":")
  if not function_name:
    raise ValueError(f"Reward {name!r} is unknown; use one of"
                     f" {sorted(REWARDS)} or 'package.module:function'.")
  try:
    fn = getattr(importlib.import_module(module_name), function_name)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"Reward {name!r} cannot be imported: {e}") from None
  if not callable(fn):
    raise ValueError(f"Reward {name!r} is not a function.")
  return fn


def _weighted(fn: RewardFn, weight: float, name: str,
              per_call: dict[str, Callable[[], Any]] | None = None,
              **settings) -> RewardFn:
  """`weight * fn(...)`, named `name` (Tunix logs rewards/<name>), given
  `settings` and, read at each call, the values of `per_call`'s functions;
  the values of its latest call stay in `reward.last_values` (for metrics,
  without computing the reward again)."""

  def reward(prompts, completions, **kwargs):
    current = {key: value() for key, value in (per_call or {}).items()}
    values = fn(prompts, completions, **settings, **current, **kwargs)
    reward.last_values = [weight * float(v) for v in values]
    return reward.last_values

  reward.__name__ = name
  return reward


def make_reward_fns(specs: Sequence[tuple[str, float]], *,
                    max_words: int = 16, max_length: int = 0,
                    overlong_buffer: int = 0,
                    completion_lengths: Callable[[], Sequence[int]]
                    | None = None) -> list[RewardFn]:
  """The weighted reward functions of `specs` ((name, weight) pairs);
  `max_words` goes to `length_penalty`; `max_length` (the rollout's
  max_new_tokens), `overlong_buffer` and `completion_lengths` (the latest
  rollout's completion lengths in tokens) to `overlong_penalty`."""
  if not specs:
    raise ValueError("rl.rewards is empty: give (name, weight) pairs, e.g."
                     " (('exact_answer', 1.0),).")
  fns = []
  for name, weight in specs:
    fn = reward_function(name)
    label = name.rpartition(":")[2]
    if fn is length_penalty:
      fns.append(_weighted(fn, float(weight), label, max_words=max_words))
    elif fn is overlong_penalty:
      if completion_lengths is None:
        raise ValueError("The overlong_penalty reward needs the rollout's"
                         " completion lengths.")
      fns.append(_weighted(fn, float(weight), label,
                           {"completion_lengths": completion_lengths},
                           max_length=max_length, buffer=overlong_buffer))
    else:
      fns.append(_weighted(fn, float(weight), label))
  return fns
