"""Test helper: a converted tiny checkpoint with a text tokenizer, and
transformers' log-likelihoods on it, to hold the eval code against.

The tokenizer maps each ASCII character to its code (0 is "</s>", EOS), so
real task text fits the tiny models' vocabulary of 128.
Test-only (imports torch and transformers).
"""

import os

import tokenizers
import torch

from maxtext.checkpoint import hf_convert
from testing import hf_tiny_models


def write_char_tokenizer(folder: str) -> str:
  """Writes the character tokenizer as `folder/tokenizer.json`; its path."""
  vocab = {"</s>": 0, **{chr(i): i for i in range(1, 128)}}
  tokenizer = tokenizers.Tokenizer(
      tokenizers.models.WordLevel(vocab, unk_token="?"))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split(
      tokenizers.Regex(r"[\s\S]"), behavior="isolated")
  tokenizer.decoder = tokenizers.decoders.Fuse()
  tokenizer.add_special_tokens(["</s>"])
  path = os.path.join(folder, "tokenizer.json")
  tokenizer.save(path)
  return path


def converted_tiny_checkpoint(folder: str, family: str = "llama3"
                              ) -> tuple[torch.nn.Module, str]:
  """(tiny transformers model, our converted checkpoint of it with the
  character tokenizer) under `folder`."""
  hf_model = hf_tiny_models.tiny_hf_model(family)
  hf_dir = os.path.join(folder, "hf")
  hf_model.save_pretrained(hf_dir)
  write_char_tokenizer(hf_dir)
  checkpoint = os.path.join(folder, "converted")
  hf_convert.hf_to_orbax(hf_dir, checkpoint)
  return hf_model, checkpoint


def log_probs(hf_model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
  """float64 log p(tokens[i + 1] | tokens[:i + 1]) for each i, [len - 1]."""
  with torch.no_grad():
    logits = hf_model(torch.tensor([tokens])).logits[0, :-1].double()
  return torch.log_softmax(logits, -1).gather(
      -1, torch.tensor(tokens[1:])[:, None])[:, 0]


def loglikelihood(hf_model: torch.nn.Module, context: list[int],
                  continuation: list[int]) -> tuple[float, bool]:
  """transformers' (sum of log p(continuation | context), greedy?)."""
  tokens = context + continuation
  with torch.no_grad():
    logits = hf_model(torch.tensor([tokens])).logits[0, :-1]
  scored = slice(len(context) - 1, len(tokens) - 1)
  greedy = logits[scored].argmax(-1).tolist() == continuation
  return float(log_probs(hf_model, tokens)[scored].sum()), greedy


def rolling_loglikelihood(hf_model: torch.nn.Module, tokens: list[int], *,
                          prefix_id: int, max_length: int) -> float:
  """log p(tokens) predicted in chunks of `max_length`: the chunk ending at
  token e sees the `max_length` tokens before it ([prefix_id] + tokens),
  and scores its own tokens only."""
  full = [prefix_id] + tokens
  total, start = 0.0, 0
  while start < len(tokens):
    end = min(start + max_length, len(tokens))
    window = full[max(0, end - max_length):end + 1]
    total += float(log_probs(hf_model, window)[-(end - start):].sum())
    start = end
  return total
