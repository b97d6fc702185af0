"""Rollout tokens/s of the built-in sampler (`maxtext.inference.generate
.generate_with_logprobs`, what `maxtext.rl.jax_rollout` runs).

Builds a random float32 model of `--shape` ("toy": the model of
configs/grpo.py; "smollm2": SmolLM2-135M's shape, a Llama with 30 layers,
width 576 and 49,152 tokens), samples `--batch` prompts of
`--prompt_length` tokens for exactly `--new_tokens` tokens (no stop token)
at temperature 1, once to compile and then `--repeats` times, and prints
the generated tokens per second of wall time (figures only):

  tools/bazel run //tools/bench:sampler_bench -- --shape=smollm2 --batch=8
"""

import time

from absl import app
from absl import flags
from flax import nnx
import numpy as np

from configs import grpo as grpo_config
from configs import llama3
from maxtext.common.model_config import ModelConfig
from maxtext.inference import generate
from maxtext.inference import sampler
from maxtext.models import registry

_SHAPE = flags.DEFINE_enum("shape", "toy", ["toy", "smollm2"],
                           "Model shape.")
_BATCH = flags.DEFINE_integer("batch", 32, "Rows per call.")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 8, "Prompt tokens.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "Generated tokens.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls.")

# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M config.json).
_SMOLLM2 = dict(vocab_size=49_152, num_layers=30, embed_dim=576, mlp_dim=1536,
                num_heads=9, num_kv_heads=3, head_dim=64, tie_embeddings=True,
                rope_theta=100_000.0)


def _model_config(shape: str) -> ModelConfig:
  if shape == "toy":
    return ModelConfig.from_dict(dict(grpo_config.get_config().model))
  model = llama3.get_config().model
  model.update(_SMOLLM2)
  return ModelConfig.from_dict(dict(model))


def main(argv: list[str]) -> None:
  del argv
  cfg = _model_config(_SHAPE.value)
  model = registry.create_model(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, cfg.vocab_size,
                         (_BATCH.value, _PROMPT_LENGTH.value)).tolist()
  params = sampler.SamplingParams(temperature=1.0)

  def call(seed):
    start = time.perf_counter()
    tokens, _ = generate.generate_with_logprobs(
        model, prompts, max_new_tokens=_NEW_TOKENS.value, params=params,
        seed=seed)
    return sum(map(len, tokens)), time.perf_counter() - start

  count, first = call(0)
  timed = [call(seed) for seed in range(1, _REPEATS.value + 1)]
  seconds = sum(t for _, t in timed)
  print(f"shape={_SHAPE.value} batch={_BATCH.value}"
        f" prompt={_PROMPT_LENGTH.value} new={_NEW_TOKENS.value}:"
        f" first call (compile) {first:.1f} s, {count} tokens;"
        f" {sum(c for c, _ in timed) / seconds:.0f} tokens/s over"
        f" {_REPEATS.value} calls")


if __name__ == "__main__":
  app.run(main)
