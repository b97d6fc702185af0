"""The toy RL task of `configs/grpo.py`: one-digit sums answered GSM8K-style.

Prompts are "a + b =" with a + b <= 9; the wanted completion is "#### c"
and the EOS. The words (digits, "+", "=", "####", "<pad>", "</s>") form a
word-level Hugging Face tokenizer, so a tiny model trained from scratch
has a 16-token vocabulary and random completions hit the format now and
then: enough signal for GRPO's group-relative advantages to raise the
format and length rewards within a few dozen updates on a CPU.
"""

import json
import os

import tokenizers

PAD = "<pad>"
EOS = "</s>"
WORDS = (PAD, EOS, *map(str, range(10)), "+", "=", "####")


def problems() -> list[dict[str, str]]:
  """Every "a + b =" with a + b <= 9 and its answer."""
  return [{"prompt": f"{a} + {b} =", "answer": str(a + b)}
          for a in range(10) for b in range(10 - a)]


def write_task(folder: str) -> tuple[str, str]:
  """Writes `tokenizer.json` and `train.jsonl` to `folder`; returns their
  paths (tokenizer, records)."""
  os.makedirs(folder, exist_ok=True)
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {w: i for i, w in enumerate(WORDS)}, unk_token=PAD))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer.add_special_tokens([PAD, EOS])
  tokenizer_path = os.path.join(folder, "tokenizer.json")
  tokenizer.save(tokenizer_path)
  records_path = os.path.join(folder, "train.jsonl")
  with open(records_path, "w", encoding="utf-8") as f:
    for record in problems():
      f.write(json.dumps(record) + "\n")
  return tokenizer_path, records_path
