"""Rollout tokens/s of vLLM vs. our JAX generation on the same model.

Builds one random float32 Llama 3 model (the shape of `configs/llama3.py`'s
small variant unless flags change it), then samples the same batch of
prompts with both rollout engines behind Tunix's `BaseRollout`:
`maxtext.rl.jax_rollout.JaxRollout` and `maxtext.rl.vllm_rollout.VllmRollout`.
Each engine runs once to warm up (compilation, vLLM's first step), then
`--repeats` times; it prints generated tokens per second of wall time, the
engine's start-up time and the time `update_params` takes (vLLM: the
in-memory weight reload).
Needs the vLLM environment (docs/vllm.md):

  VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH=. /tmp/vllm_venv/bin/python \\
      tools/bench/vllm_bench.py --batch=8 --new_tokens=64
"""

import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from flax import nnx
import numpy as np
import tokenizers
import transformers
from tunix.generate import tokenizer_adapter
from tunix.rl.rollout import base_rollout

from configs import llama3
from maxtext.common.model_config import ModelConfig
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.rl import jax_rollout
from maxtext.rl import policy
from maxtext.rl import vllm_rollout
# pylint: enable=g-import-not-at-top,wrong-import-position

_BATCH = flags.DEFINE_integer("batch", 8, "Prompts per rollout call.")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 16,
                                      "Tokens per prompt.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64,
                                   "Tokens generated per prompt.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per engine.")
_VOCAB = flags.DEFINE_integer("vocab_size", 1024, "Vocabulary size.")
_LAYERS = flags.DEFINE_integer("num_layers", 4, "Decoder layers.")

# Token 0 pads, 1 is the EOS.
_PAD, _EOS = 0, 1


def _tokenizer(vocab_size: int) -> tokenizer_adapter.TokenizerAdapter:
  """Word-level: "t<i>" is token i."""
  vocab = {"<pad>": _PAD, "</s>": _EOS}
  vocab.update({f"t{i}": i for i in range(2, vocab_size)})
  tok = tokenizers.Tokenizer(
      tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  return tokenizer_adapter.TokenizerAdapter(
      transformers.PreTrainedTokenizerFast(
          tokenizer_object=tok, eos_token="</s>", pad_token="<pad>"))


def _config() -> base_rollout.RolloutConfig:
  # Sampling stops at the EOS too; tokens/s counts what was generated.
  return base_rollout.RolloutConfig(
      max_tokens_to_generate=_NEW_TOKENS.value, temperature=1.0, top_p=1.0,
      max_prompt_length=_PROMPT_LENGTH.value,
      rollout_vllm_kwargs=dict(kv_cache_memory_bytes=256 << 20))


def _time_engine(name: str, make_engine, actor: nnx.Module,
                 prompts: list[str]) -> None:
  """Prints `make_engine()`'s start-up, update and generation times."""
  start = time.perf_counter()
  engine = make_engine()
  startup = time.perf_counter() - start
  engine.generate(prompts, _config())
  tokens, start = 0, time.perf_counter()
  for _ in range(_REPEATS.value):
    out = engine.generate(prompts, _config())
    tokens += sum(len(t) for t in out.tokens)
  elapsed = time.perf_counter() - start
  start = time.perf_counter()
  engine.update_params(nnx.state(actor, nnx.Param))
  update = time.perf_counter() - start
  print(f"{name}: {tokens / elapsed:,.1f} tokens/s ({tokens} tokens in "
        f"{elapsed:.2f} s; batch {len(prompts)}, up to {_NEW_TOKENS.value} "
        f"new tokens each); start-up {startup:.1f} s; update_params "
        f"{update:.2f} s")


def main(argv):
  del argv
  model = llama3.get_config().model
  model.update(vocab_size=_VOCAB.value, num_layers=_LAYERS.value)
  cfg = ModelConfig.from_dict(model)
  actor = policy.PolicyModel.of(adapter.TunixModel(
      registry.create_model(cfg, rngs=nnx.Rngs(0))))
  tokenizer = _tokenizer(_VOCAB.value)
  rng = np.random.default_rng(0)
  prompts = [" ".join(f"t{i}" for i in rng.integers(
      2, _VOCAB.value, _PROMPT_LENGTH.value)) for _ in range(_BATCH.value)]
  print(f"Model: llama3 {cfg.num_layers} layers, embed {cfg.embed_dim}, "
        f"head_dim {cfg.attention.head_dim}, vocab {cfg.vocab_size},"
        f" {cfg.dtype}.")
  engines = {"jax": jax_rollout.JaxRollout,
             "vllm": vllm_rollout.VllmRollout}
  for name, engine in engines.items():
    _time_engine(name, lambda e=engine: e(
        rollout_actor=actor, tokenizer=tokenizer, mesh=None,
        rollout_config=_config()), actor, prompts)


if __name__ == "__main__":
  app.run(main)
