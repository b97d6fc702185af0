"""Test helper: a tiny converted checkpoint with a word tokenizer, chat data
and post-training configs built from the real config files.

Test-only (builds the checkpoint from a random `transformers` model).
"""

from collections.abc import Iterator
import contextlib
import json
import os
import sys
from typing import Any
from unittest import mock
import warnings

from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tokenizers

from configs import distill as distill_config
from configs import dpo as dpo_config
from configs import sft as sft_config
from maxtext.checkpoint import hf_convert
from maxtext.data import caption_task
from maxtext.posttrain import tunix_hooks
from testing import hf_tiny_models

# Words w0..w{NUM_WORDS-1} have ids 0..; then the template's words, then
# those of the caption task (`maxtext.data.caption_task`).
NUM_WORDS = 100
SPECIAL_WORDS = ("<s>", "</s>", "user", "assistant", "system")
CAPTION_WORDS = tuple(sorted({
    "a", *caption_task.COLORS, *caption_task.SHAPES,
    *caption_task.PROMPT.split()}))
# The tiny vision-language model's image ids, after every word.
VLM_IDS = dict(boi_token_index=125, eoi_token_index=126,
               image_token_index=127)
# A chat template whose markup is whitespace-separated words of the
# tokenizer: "user w1 w2 assistant w3 </s>".
TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }} {{ message['content'] }} "
    "{% if message['role'] == 'assistant' %}{{ eos_token }} {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}")


def word(i: int) -> str:
  return f"w{i}"


def write_tokenizer(path: str, specials: dict[str, int] | None = None
                    ) -> None:
  """A word-level tokenizer.json of the words and the template's words,
  and `specials` (word -> id) beyond them."""
  vocab = {word(i): i for i in range(NUM_WORDS)}
  vocab.update({w: len(vocab) + i
                for i, w in enumerate(SPECIAL_WORDS + CAPTION_WORDS)})
  specials = specials or {}
  # Ids below the specials' that no word has get fillers (no holes).
  for i in range(len(vocab), max(specials.values(), default=0)):
    if i not in specials.values():
      vocab[f"<unused{i}>"] = i
  vocab.update(specials)
  tokenizer = tokenizers.Tokenizer(
      tokenizers.models.WordLevel(vocab, unk_token=word(0)))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer.save(path)


def write_checkpoint(folder: str, family: str = "llama3", seed: int = 0
                     ) -> str:
  """A converted checkpoint (scanned layout) of a tiny random `family`
  model with the word tokenizer, and its Hugging Face folder; returns the
  checkpoint folder (`<folder>/ckpt`, the HF one is `<folder>/hf`).
  `family` "gemma3_vlm": the tiny Gemma 3 vision-language model;
  "llama4_vlm": the tiny Llama 4 one (its tokenizer also has Llama 4's
  image prompt tokens, `hf_tiny_models.LLAMA4_VLM_TEXT_IDS`)."""
  hf_dir = os.path.join(folder, "hf")
  specials = None
  if family == "gemma3_vlm":
    hf_model = hf_tiny_models.tiny_gemma3_vlm(seed, vocab_size=128,
                                               ids=VLM_IDS)
  elif family == "llama4_vlm":
    hf_model = hf_tiny_models.tiny_llama4_vlm(seed)
    specials = hf_tiny_models.LLAMA4_VLM_TEXT_IDS
  else:
    hf_model = hf_tiny_models.tiny_hf_model(family, seed=seed)
  hf_model.save_pretrained(hf_dir)
  write_tokenizer(os.path.join(hf_dir, "tokenizer.json"), specials)
  out = os.path.join(folder, "ckpt")
  hf_convert.hf_to_orbax(hf_dir, out)
  return out


def write_jsonl(path: str, records) -> str:
  with open(path, "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  return path


def mapping_records(count: int, offset: int = 0) -> list[dict[str, str]]:
  """Prompt/completion records of a fixed mapping: "w{a} w{b}" -> "w{c}"
  with c a function of (a, b)."""
  records = []
  for i in range(offset, offset + count):
    a, b = i % 10, 10 + (i * 7) % 10
    records.append({"prompt": f"{word(a)} {word(b)}",
                    "completion": word(20 + (a * 3 + b) % 30)})
  return records


def template_file(folder: str) -> str:
  path = os.path.join(folder, "template.jinja")
  with open(path, "w", encoding="utf-8") as f:
    f.write(TEMPLATE)
  return path


def _common(config: ml_collections.ConfigDict, folder: str, load: str,
            steps: int) -> ml_collections.ConfigDict:
  config.train.load = load
  config.train.steps = steps
  config.data.tokenizer = os.path.join(os.path.dirname(load), "hf",
                                       "tokenizer.json")
  config.data.chat_template = template_file(folder)
  config.data.seq_len = 16
  config.data.prefetch = 0
  config.logging.tensorboard = False
  return config


def sft_test_config(folder: str, load: str, *, steps: int, train_file: str,
                    **lora) -> ml_collections.ConfigDict:
  """`configs/sft.py` on `train_file` (prompt/completion JSONL), packing
  "none" (one record per row), batch 8."""
  config = _common(sft_config.get_config(), folder, load, steps)
  config.data.source = "jsonl"
  config.data.files = train_file
  config.data.packing = "none"
  config.sft.prompt_field = "prompt"
  config.sft.completion_field = "completion"
  config.train.batch_size = 8
  config.optimizer.warmup_steps = 0
  config.lora.update(lora)
  return config


def dpo_test_config(folder: str, load: str, *, steps: int, train_file: str,
                    method: str) -> ml_collections.ConfigDict:
  """`configs/dpo.py` on `train_file` (prompt/chosen/rejected JSONL)."""
  config = _common(dpo_config.get_config(), folder, load, steps)
  config.train.method = method
  config.data.source = "jsonl"
  config.data.files = train_file
  config.dpo.max_prompt_length = 4
  config.dpo.max_response_length = 4
  config.train.batch_size = 8
  config.optimizer.warmup_steps = 0
  return config


def distill_test_config(folder: str, load: str, teacher: str, *, steps: int,
                        train_file: str) -> ml_collections.ConfigDict:
  """`configs/distill.py` on `train_file` (prompt/completion JSONL)."""
  config = _common(distill_config.get_config(), folder, load, steps)
  config.distill.teacher = teacher
  config.data.source = "jsonl"
  config.data.files = train_file
  config.data.packing = "none"
  config.sft.prompt_field = "prompt"
  config.sft.completion_field = "completion"
  config.train.batch_size = 8
  config.optimizer.warmup_steps = 0
  return config


def parse_binary_flags(argv: list[str]) -> list[str]:
  """Parses a binary's command line `argv` into absl's flags (do it once per
  process: override flags can be defined only once); returns the rest."""
  with mock.patch.object(sys, "argv", argv), warnings.catch_warnings():
    # ml_collections loads config files with the deprecated load_module.
    warnings.filterwarnings("ignore", message=".*load_module",
                            category=DeprecationWarning)
    return flags.FLAGS(argv)


def run_binary_main(main, argv: list[str], user_dir: str) -> None:
  """Runs a binary's `main(argv)` as if started from `user_dir`."""
  with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": user_dir}):
    main(argv)


@contextlib.contextmanager
def first_steps() -> Iterator[list[dict[str, Any]]]:
  """While active, every post-training trainer records its first train
  step: "state" (a copy of its (model, optimizer) state before the step),
  "example" (the prepared, sharded batch the step received), "out" ((loss,
  aux, grad_norm)) and "params" (its parameters after the step, as a pure
  dict). Yields the list of records, one per trainer."""
  records = []
  run_our_step = tunix_hooks.run_our_step

  def recording(trainer, *, has_aux):
    run_our_step(trainer, has_aux=has_aux)
    jit_both = trainer.jit_train_and_eval_step

    def jit_train_and_eval_step(skip_jit=False, cache_nnx_graph=False):
      step, eval_step = jit_both(skip_jit, cache_nnx_graph)

      def first(example):
        if any(record["trainer"] is trainer for record in records):
          return step(example)
        state = jax.tree.map(jnp.copy, nnx.state((trainer.model,
                                                  trainer.optimizer)))
        out = step(example)
        records.append(dict(trainer=trainer, state=state, example=example,
                            out=out, params=nnx.to_pure_dict(
                                nnx.state(trainer.model, nnx.Param))))
        return out

      first.func = step.func  # Tunix reads the step's jitted function.
      return first, eval_step

    trainer.jit_train_and_eval_step = jit_train_and_eval_step

  with mock.patch.object(tunix_hooks, "run_our_step", recording):
    yield records


# The 16 NormalFloat4 values (Dettmers et al. 2023, QLoRA, appendix E).
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], np.float32)


def assert_nf4(test, qarray, original: np.ndarray,
               dequantized: np.ndarray) -> None:
  """Asserts that `qarray` (a qwix array of a [rows, columns] kernel) holds
  `original` in NF4 as the QLoRA paper defines it: one absmax scale per
  column and tile of rows, each weight the nearest NF4 value of weight /
  scale, and `dequantized` = NF4[code] * scale."""
  codes = np.asarray(qarray.qvalue).astype(np.int64)
  scale = np.asarray(qarray.scale, np.float32)
  tiles = scale.shape[0]
  test.assertEqual(codes.shape, original.shape)
  absmax = np.abs(original).reshape(tiles, -1, original.shape[1]).max(1)
  np.testing.assert_allclose(scale, absmax, rtol=1e-6)
  scale_full = np.repeat(scale, original.shape[0] // tiles, axis=0)
  x = original / scale_full
  np.testing.assert_allclose(np.abs(x - NF4[codes]),
                             np.abs(x[..., None] - NF4).min(-1), atol=1e-6)
  np.testing.assert_allclose(dequantized, NF4[codes] * scale_full,
                             rtol=1e-6)
