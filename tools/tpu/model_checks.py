"""The harness's `models` suite: every family's tiny model on the device
JAX runs on against the CPU.

A CPU-only process (JAX_PLATFORMS=cpu, so every "auto" kernel is the CPU's)
builds each family's tiny test model (`testing.tiny_configs`, widened on a
chip to the 128-lane dims its kernels tile), and saves its parameters and
its float32 logits at `highest` precision on a batch of random tokens. This
process loads the same parameters into the same model on its device (the
chip's kernels: splash, megablox) and compares the logits at `highest`
precision against `TOLERANCE`; errors are the largest difference over the
largest CPU logit. The error at the default precision (one bfloat16 pass
per float32 matmul on a TPU, about three digits) is reported, not checked:
models that choose by top-k (experts, DeepSeek Sparse Attention's tokens)
choose otherwise on near ties there, which moves their logits by O(1) (0.2
to 0.9 of the largest on a v5e) without a bug. One MoE model also compares
the gradients of its loss with respect to every parameter through the
device's grouped matmul (megablox on one chip) against its
dense experts (every token through every expert), on the device.
"""

import os
import subprocess
import sys
import tempfile

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.models import registry
from testing import tiny_configs
from tools.tpu import kernel_checks

# Float32 weights at `highest` precision through three tiny layers: on a
# v5e, 2.2e-6 to 5.1e-5 of the largest logit for the attention and expert
# families (1024 tokens), a wrong kernel is off by O(1). The Gated DeltaNet
# families (qwen3_5, qwen3_5_moe, qwen3_next) miss it: 1.7e-4 to 2.3e-4 at
# 64 tokens, 5.8e-4 to 9.8e-4 at 1024 (docs/tpu.md, open).
TOLERANCE = 5e-4
_WINDOW = 16
# On a chip, longer than one 512-token block: "auto" takes the plain
# reference for a length a single block holds, splash beyond.
_BATCH, _SMALL_LENGTH, _LENGTH = 2, 64, 1024
_MOE_FAMILY = "qwen3_moe"


def _config(family: str, small: bool, **changes):
  if not small:  # The chip's kernels tile 128 lanes.
    model = tiny_configs.CONFIG_MODULES[family].get_config().model
    changes = dict(embed_dim=128, mlp_dim=256, vocab_size=256, **changes)
    if model.attention_type != "mla":  # MLA's head_dim is its rotary part.
      changes["head_dim"] = 128
    if model.num_experts:
      changes["moe_mlp_dim"] = 128
  return tiny_configs.tiny_model_config(family, window=_WINDOW, **changes)


def _model(cfg):
  return registry.create_model(cfg, rngs=nnx.Rngs(1))


def _tokens(cfg, small: bool) -> np.ndarray:
  return np.random.RandomState(0).randint(
      0, cfg.vocab_size,
      size=(_BATCH, _SMALL_LENGTH if small else _LENGTH)).astype(np.int32)


@nnx.jit
def _logits(model, tokens_BL):
  return model(tokens_BL)


def _params(model) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def _load(model, leaves) -> None:
  state = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.unflatten(
      jax.tree.structure(state), [jnp.asarray(x) for x in leaves]))


def write_references(folder: str, small: bool, families: list[str]) -> None:
  """In a CPU-only process: each family's parameters and logits (a family
  that fails leaves no file, and its check says so)."""
  for family in families:
    try:
      cfg = _config(family, small)
      model = _model(cfg)
      with jax.default_matmul_precision("highest"):
        logits = np.asarray(_logits(model, _tokens(cfg, small)))
    except Exception as e:  # pylint: disable=broad-exception-caught
      print(f"{family}: {type(e).__name__}: {e}", file=sys.stderr)
      continue
    np.savez(os.path.join(folder, f"{family}.npz"), *_params(model),
             logits=logits)


def _moe_gradients(small: bool) -> dict:
  """Gradients of the MoE model's mean log-likelihood through the device's
  grouped matmul ("dropless") against its dense experts, on the device."""
  grads = {}
  for impl in ("dropless", "dense"):
    cfg = _config(_MOE_FAMILY, small, moe_impl=impl)
    model = _model(cfg)
    tokens = jnp.asarray(_tokens(cfg, small))

    @nnx.jit
    def grad(model, tokens):
      def loss(model):
        logits = model(tokens)[:, :-1]
        return -jnp.mean(jnp.take_along_axis(
            jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))
      return nnx.grad(loss)(model)

    with jax.default_matmul_precision("highest"):
      grads[impl] = [np.asarray(x, np.float32)
                     for x in jax.tree.leaves(grad(model, tokens))]
  worst = max(float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-30)
              for a, b in zip(grads["dropless"], grads["dense"]))
  return {"name": f"moe_gradients/{_MOE_FAMILY}", "dtype": "float32",
          "tolerance": TOLERANCE, "errors": {"grads": worst},
          "passed": worst <= TOLERANCE}


def run(small: bool, only=()) -> list[dict]:
  """Compares every family (those starting with one of `only`; all when
  empty), printing a line for each."""
  families = [f for f in tiny_configs.CONFIG_MODULES
              if not only or any(f.startswith(p) for p in only)]
  results = []
  with tempfile.TemporaryDirectory() as folder:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "tools.tpu.model_checks", folder,
               ",".join(families)] + (["--small"] if small else [])
    subprocess.run(command, env=env, check=True)
    for family in families:
      result = {"name": f"logits/{family}", "dtype": "float32",
                "tolerance": TOLERANCE}
      try:
        cfg = _config(family, small)
        saved = np.load(os.path.join(folder, f"{family}.npz"))
        model = _model(cfg)
        _load(model, [saved[f"arr_{i}"] for i in range(len(saved) - 1)])
        want = saved["logits"]
        scale = float(np.abs(want).max())
        errors = {}
        for precision in ("highest", "default"):
          with jax.default_matmul_precision(precision):
            got = np.asarray(_logits(model,
                                     jnp.asarray(_tokens(cfg, small))))
          errors[precision] = float(np.abs(got - want).max()) / scale
        result.update(errors=errors, passed=errors["highest"] <= TOLERANCE)
      except Exception as e:  # pylint: disable=broad-exception-caught
        result.update(passed=False, error=kernel_checks.error_line(e))
      results.append(result)
  if not only or any(_MOE_FAMILY.startswith(p) for p in only):
    results.append(_moe_gradients(small))
  for r in results:
    errors = ", ".join(f"{k} {v:.2e}" for k, v in r.get("errors", {}).items())
    print(f"{'ok  ' if r['passed'] else 'FAIL'} {r['name']}: {errors}"
          + (f" {r['error']}" if "error" in r else ""), flush=True)
  return results


if __name__ == "__main__":
  write_references(sys.argv[1], "--small" in sys.argv[3:],
                   sys.argv[2].split(","))
