"""The harness's `binaries` suite: `train` and `decode` run as a user runs
them, on the device JAX runs on.

- train/<data>: the default config (`--config=gemma3`) on synthetic tokens
  and on the bundled text trains `STEPS` updates and saves; a second run
  stopped after half of them (the same schedule) and started again resumes
  from its checkpoint, and its losses after the restart equal the
  uninterrupted run's exactly. No run starts the distributed runtime.
- decode/<cache>: greedy tokens from the text run's checkpoint, with a dense
  and a paged KV cache, equal a CPU-only process's (JAX_PLATFORMS=cpu), and
  its prefill logits (`--dump_logits`) are within `LOGITS_TOLERANCE` of the
  CPU's largest logit. The
  device runs at `highest` matmul precision (JAX_DEFAULT_MATMUL_PRECISION):
  at the default, a TPU's one bfloat16 pass per float32 product can break a
  near tie of an undertrained model's logits.

Each binary is a process of its own, bounded by `TIMEOUT_S`; its output is
kept in the result when it fails.
"""

import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from maxtext.metrics import writers

STEPS = 20
# The model_checks bound: float32 at `highest` precision on a v5e.
LOGITS_TOLERANCE = 5e-4
TIMEOUT_S = 240
_PROMPT = "1,17,5,300,42,9"
_RUNTIME_UP = "Distributed runtime up"


def _run(module: str, args: list[str], **env) -> tuple[int, str]:
  """(exit status, output) of `python -m module args` with `env` added."""
  try:
    process = subprocess.run(
        [sys.executable, "-m", module] + args, env=dict(os.environ, **env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=TIMEOUT_S, check=False)
    return process.returncode, process.stdout
  except subprocess.TimeoutExpired as e:
    out = e.stdout if isinstance(e.stdout, str) else (
        (e.stdout or b"").decode(errors="replace"))
    return -1, out + f"\n(timed out after {TIMEOUT_S} s)"


def _failure(name: str, status: int, output: str) -> dict:
  return {"name": name, "passed": False,
          "error": f"exit status {status}", "output": output[-3000:]}


def _train(workdir: str, data: str, steps: int) -> tuple[int, str]:
  args = [f"--workdir={workdir}", "--config=gemma3",
          f"--config.train.steps={steps}",
          f"--config.optimizer.decay_steps={STEPS}",
          f"--config.checkpoint.every_steps={STEPS // 2}",
          "--config.logging.every_steps=1",
          "--config.logging.tensorboard=False"]
  if data == "synthetic":
    args.append("--config.data.source=synthetic")
  return _run("maxtext.bin.train", args)


def _losses(workdir: str) -> dict[int, float]:
  return {step: m["train/loss"] for step, m in writers.read_jsonl(
      os.path.join(workdir, writers.JSONL_FILENAME)).items()
          if "train/loss" in m}


def train_and_resume(folder: str, data: str) -> dict:
  """Trains `STEPS` updates whole, and in two runs; compares the losses."""
  name = f"train/{data}"
  whole, halves = (os.path.join(folder, f"{data}_{w}")
                   for w in ("whole", "halves"))
  outputs = []
  for workdir, steps in ((whole, STEPS), (halves, STEPS // 2),
                         (halves, STEPS)):
    status, output = _train(workdir, data, steps)
    outputs.append(output)
    if status:
      return _failure(name, status, output)
  want, got = _losses(whole), _losses(halves)
  resumed = [s for s in range(STEPS // 2 + 1, STEPS + 1)]
  missing = [s for s in resumed if s not in want or s not in got]
  if missing:
    return _failure(name, 0, f"no loss logged for steps {missing}\n"
                    + outputs[-1])
  difference = max(abs(got[s] - want[s]) for s in resumed)
  saved = os.path.isdir(os.path.join(whole, "checkpoints", str(STEPS)))
  runtime = any(_RUNTIME_UP in o for o in outputs)
  return {"name": name, "passed": difference == 0 and saved and not runtime,
          "errors": {"resumed_loss_difference": difference},
          "losses": [want[s] for s in sorted(want)], "saved": saved,
          "distributed_runtime_started": runtime}


def decode(checkpoint: str, cache: str) -> dict:
  """Greedy tokens and prefill logits on the device and on the CPU."""
  name = f"decode/{cache}"
  tokens, logits = {}, {}
  for where, env in (("device", dict(JAX_DEFAULT_MATMUL_PRECISION="highest")),
                     ("cpu", dict(JAX_PLATFORMS="cpu"))):
    dump = os.path.join(os.path.dirname(checkpoint), f"{cache}_{where}.npy")
    status, output = _run("maxtext.bin.decode", [
        f"--checkpoint={checkpoint}", f"--prompt_ids={_PROMPT}",
        "--max_new_tokens=16", f"--kv_cache={cache}",
        f"--dump_logits={dump}"], **env)
    match = re.search(rf"^{_PROMPT} -> ([0-9,]*)$", output, re.MULTILINE)
    if status or not match:
      return _failure(f"{name} ({where})", status, output)
    tokens[where], logits[where] = match.group(1), np.load(dump)
  error = float(np.abs(logits["device"] - logits["cpu"]).max() /
                np.abs(logits["cpu"]).max())
  return {"name": name, "tokens": tokens, "errors": {"prefill_logits": error},
          "passed": tokens["device"] == tokens["cpu"] and
                    error <= LOGITS_TOLERANCE}


def run(small: bool, only=()) -> list[dict]:
  """The checks (those whose names start with one of `only`; all when
  empty), printing a line for each. `small` changes nothing: the default
  config is what a user trains first."""
  del small
  wanted = lambda name: not only or any(name.startswith(p) for p in only)
  results = []
  with tempfile.TemporaryDirectory() as folder:
    # The runs share compiled programs (the binaries' default is a cache in
    # each workdir).
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                          os.path.join(folder, "jax-cache"))
    for data in ("synthetic", "text"):
      if wanted(f"train/{data}") or (data == "text" and wanted("decode")):
        results.append(train_and_resume(folder, data))
    checkpoint = os.path.join(folder, "text_whole")
    for cache in ("dense", "paged"):
      if wanted(f"decode/{cache}"):
        results.append(decode(checkpoint, cache))
  for r in results:
    print(f"{'ok  ' if r['passed'] else 'FAIL'} {r['name']}:"
          f" {r.get('errors') or r.get('error')}"
          + (f" tokens {r['tokens']}" if "tokens" in r else ""),
          flush=True)
  return results
