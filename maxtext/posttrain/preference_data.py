"""Preference records (prompt, chosen, rejected) -> Tunix DPO batches.

Each record's prompt (a string: one user turn; or a list of chat messages)
and its two responses are rendered by the chat template: the prompt with
the generation prompt, each response as the assistant turn that follows
(its tokens are the ones `ChatEncoder.encode` weights, end-of-turn markup
included). The prompt keeps its last `max_prompt_length` tokens and is
left-padded; each response keeps its first `max_response_length` tokens and
is right-padded (Tunix's `dpo_trainer.TrainingInput` layout; padding id 0,
mask 0).

`PreferenceBatches` repeats the records in a new random order each epoch
(seeded); the eval split is read once in order.

Shapes: B pairs per batch, P max_prompt_length, R max_response_length.
"""

from collections.abc import Iterator
import dataclasses
from typing import Any

import numpy as np
from tunix.sft.dpo import dpo_trainer

from maxtext.data import chat_template as chat_lib
from maxtext.data import pipeline
from maxtext.data.data_config import DataConfig
from maxtext.posttrain import rows as rows_lib


@dataclasses.dataclass(frozen=True)
class TokenizedPairs:
  """Every record of a split, tokenized and padded.

  Attributes:
    prompt_ids: [N, P] left-padded.
    prompt_mask: [N, P] 1 on prompt tokens.
    chosen_ids: [N, R] right-padded.
    chosen_mask: [N, R].
    rejected_ids: [N, R].
    rejected_mask: [N, R].
  """

  prompt_ids: np.ndarray
  prompt_mask: np.ndarray
  chosen_ids: np.ndarray
  chosen_mask: np.ndarray
  rejected_ids: np.ndarray
  rejected_mask: np.ndarray

  def __len__(self) -> int:
    return len(self.prompt_ids)

  def batch(self, indices: np.ndarray) -> dpo_trainer.TrainingInput:
    return dpo_trainer.TrainingInput(**{
        f.name: getattr(self, f.name)[indices]
        for f in dataclasses.fields(self)})


def _pad(ids: list[int], length: int, *, left: bool
         ) -> tuple[np.ndarray, np.ndarray]:
  ids = ids[-length:] if left else ids[:length]
  padded = np.zeros((length,), np.int32)
  mask = np.zeros((length,), np.int32)
  where = slice(length - len(ids), length) if left else slice(0, len(ids))
  padded[where] = ids
  mask[where] = 1
  return padded, mask


def _messages(prompt: Any, where: str) -> list[dict[str, str]]:
  if isinstance(prompt, str):
    return [{"role": "user", "content": prompt}]
  if isinstance(prompt, list):
    return list(prompt)
  raise ValueError(f"Record {where}: the prompt is a {type(prompt).__name__};"
                   " expected a string or a list of messages.")


def _response_ids(chat: chat_lib.ChatEncoder, messages, response: Any,
                  where: str) -> tuple[list[int], list[int]]:
  """(prompt ids, response ids) of `messages` followed by `response`."""
  if not isinstance(response, str):
    raise ValueError(f"Record {where}: a response is a"
                     f" {type(response).__name__}; expected a string.")
  try:
    ids, weights = chat.encode(
        [*messages, {"role": chat_lib.ASSISTANT_ROLE, "content": response}])
  except chat_lib.ChatTemplateError as e:
    raise ValueError(f"Record {where}: {e}") from e
  weights = np.asarray(weights)
  # The last assistant turn is the response; earlier ones belong to the
  # prompt's conversation.
  end = int(np.flatnonzero(weights)[-1]) + 1
  start = end
  while start > 0 and weights[start - 1]:
    start -= 1
  return ids[:start], ids[start:end]


def tokenize_pairs(records, chat: chat_lib.ChatEncoder, *,
                   max_prompt_length: int,
                   max_response_length: int) -> TokenizedPairs:
  """Tokenizes records {"prompt", "chosen", "rejected"} (see the module doc).

  Raises:
    ValueError: there are no records, or one is malformed (names it).
  """
  columns = {f.name: [] for f in dataclasses.fields(TokenizedPairs)}
  for i, record in enumerate(records):
    where = f"#{i}"
    messages = _messages(record["prompt"], where)
    for name in ("chosen", "rejected"):
      prompt_ids, response_ids = _response_ids(chat, messages, record[name],
                                               where)
      ids, mask = _pad(response_ids, max_response_length, left=False)
      columns[f"{name}_ids"].append(ids)
      columns[f"{name}_mask"].append(mask)
    ids, mask = _pad(prompt_ids, max_prompt_length, left=True)
    columns["prompt_ids"].append(ids)
    columns["prompt_mask"].append(mask)
  if not columns["prompt_ids"]:
    raise ValueError("The preference files hold no records.")
  return TokenizedPairs(**{k: np.stack(v) for k, v in columns.items()})


def load_pairs(data: DataConfig, dpo, *, files: str, kind: str
               ) -> TokenizedPairs:
  """The tokenized records of `files` (format `kind`) for the `dpo`
  section's fields and lengths, with `data`'s tokenizer and template."""
  chat = chat_lib.ChatEncoder(chat_lib.load_template(data.chat_template),
                              pipeline.make_tokenizer(data))
  fields = (dpo.prompt_field, dpo.chosen_field, dpo.rejected_field)
  records = ({"prompt": row[fields[0]], "chosen": row[fields[1]],
              "rejected": row[fields[2]]}
             for row in rows_lib.read_rows(kind, files, fields))
  return tokenize_pairs(records, chat,
                        max_prompt_length=dpo.max_prompt_length,
                        max_response_length=dpo.max_response_length)


class PreferenceBatches:
  """Training batches of `rows` pairs: each epoch a new seeded order."""

  def __init__(self, pairs: TokenizedPairs, rows: int, seed: int):
    if len(pairs) < rows:
      raise ValueError(f"{len(pairs)} preference records are fewer than one"
                       f" batch of {rows}.")
    self.pairs = pairs
    self.rows = rows
    self.seed = seed

  def __iter__(self) -> Iterator[dpo_trainer.TrainingInput]:
    epoch = 0
    while True:
      order = np.random.default_rng((self.seed, epoch)).permutation(
          len(self.pairs))
      for start in range(0, len(order) - self.rows + 1, self.rows):
        yield self.pairs.batch(order[start:start + self.rows])
      epoch += 1


class EvalPreferenceBatches:
  """At most `steps` full batches of the eval split, in order."""

  def __init__(self, pairs: TokenizedPairs, rows: int, steps: int):
    self.pairs = pairs
    self.rows = rows
    self.steps = steps

  def __iter__(self) -> Iterator[dpo_trainer.TrainingInput]:
    count = min(self.steps, len(self.pairs) // self.rows)
    for step in range(count):
      yield self.pairs.batch(np.arange(step * self.rows,
                                       (step + 1) * self.rows))
