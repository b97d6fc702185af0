r"""Rollout speed and the share of a GRPO step spent sampling, on a real model.

Runs `grpo` (`maxtext.rl.grpo.run`) for `--updates` policy updates of an RL
config (default `configs/grpo.py:smollm2_arithmetic`: its batch, prompt and
completion lengths, temperature and stop tokens) from the converted
checkpoint `--checkpoint`, once per engine, with dynamic sampling off (one
batch of rollouts per update), and prints from each run's metrics, after
`--warmup` batches (compilations): the rollout's generated tokens/s, its
seconds per batch, the whole batch's seconds (policy update, rollouts,
scoring: `perf/batch_seconds`) and the share spent sampling. vLLM refuses
LoRA policies, so its row and a built-in row beside it train the full model
(`lora.mode=full`); the built-in engine's first row keeps the config's LoRA.

  tools/bazel run //maxtext/bin:convert_ckpt -- --gguf=... --out=ckpts/smollm2
  tools/bazel run //tools/bench:rollout_bench -- --checkpoint=ckpts/smollm2
  # with vLLM (CPU) beside it (@pypi_vllm, docs/vllm.md):
  tools/bazel run //tools/bench:rollout_bench_vllm -- \
      --checkpoint=ckpts/smollm2 --engines=jax,vllm
"""

import os
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
import numpy as np

from configs import grpo as grpo_config
from maxtext.common import paths
from maxtext.metrics import writers
from maxtext.rl import grpo
# pylint: enable=g-import-not-at-top,wrong-import-position

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Converted checkpoint to start from.", required=True)
_VARIANT = flags.DEFINE_string("variant", "smollm2_arithmetic",
                               "configs/grpo.py variant.")
_ENGINES = flags.DEFINE_list("engines", ["jax"], "Rollout engines: jax, vllm.")
_UPDATES = flags.DEFINE_integer("updates", 6, "Policy updates per run.")
_WARMUP = flags.DEFINE_integer("warmup", 2,
                               "Batches left out of the figures.")


def _run(engine: str, lora_mode: str | None) -> dict[str, float]:
  """One run's steady-state figures (see the module docstring)."""
  config = grpo_config.get_config(_VARIANT.value)
  config.train.load = paths.user_path(_CHECKPOINT.value)
  config.train.steps = _UPDATES.value
  config.rl.dynamic_sampling_rounds = 0
  config.rollout.engine = engine
  if lora_mode:
    config.lora.mode = lora_mode
  config.logging.tensorboard = False
  config.export.merged = False
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    grpo.run(config, workdir)
    wall = time.perf_counter() - start
    steps = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  batches = [steps[step] for step in sorted(steps)
             if "train/perf/batch_seconds" in steps[step]]
  batches = batches[max(_WARMUP.value - 1, 0):]
  if not batches:
    raise ValueError(f"--updates={_UPDATES.value} leaves no batch after"
                     f" --warmup={_WARMUP.value}; raise --updates.")

  def total(key):
    return float(np.sum([s[f"train/{key}"] for s in batches]))

  rollout, batch = total("rollout/seconds"), total("perf/batch_seconds")
  return dict(tokens_per_s=float(np.mean(
                  [s["train/rollout/tokens_per_s"] for s in batches])),
              rollout=rollout / len(batches), batch=batch / len(batches),
              share=rollout / batch, batches=len(batches), wall=wall)


def main(argv):
  del argv
  config = grpo_config.get_config(_VARIANT.value)
  rows = config.train.batch_size * config.rl.num_generations
  r = config.rollout
  print(f"{_VARIANT.value}: {rows} completions per batch "
        f"({config.train.batch_size} prompts x {config.rl.num_generations}),"
        f" prompts up to {r.max_prompt_length} tokens, up to "
        f"{r.max_new_tokens} new, temperature {r.temperature}; "
        f"{_CHECKPOINT.value}")
  bad = set(_ENGINES.value) - {"jax", "vllm"}
  if bad:
    raise app.UsageError(f"--engines={','.join(_ENGINES.value)} holds"
                         f" {sorted(bad)}; valid: jax, vllm.")
  # vLLM's rows train the whole model; None keeps the config's LoRA.
  full = "full" if config.lora.mode != "full" else None
  runs = [("jax", None)] if "jax" in _ENGINES.value else []
  if "vllm" in _ENGINES.value:
    if full and "jax" in _ENGINES.value:
      runs.append(("jax", full))
    runs.append(("vllm", full))
  print("| engine | lora.mode | rollout tokens/s | rollout s/batch |"
        " batch s | sampling share |")
  print("|---|---|---|---|---|---|")
  for engine, lora_mode in runs:
    f = _run(engine, lora_mode)
    training = lora_mode or config.lora.mode
    print(f"| {engine} | {training} | {f['tokens_per_s']:.1f} |"
          f" {f['rollout']:.1f} | {f['batch']:.1f} | {f['share']:.0%} |"
          f"  ({f['batches']} batches; run {f['wall']:.0f} s)", flush=True)


if __name__ == "__main__":
  app.run(main)
