r"""Attention that is not quadratic vs full attention: training step and
decoding by length.

Variants of one model that differ only in their attention, by `--family`:

  qwen3_5 (configs/qwen3_5.py's `small` shape): which layers are Gated
  DeltaNet (linear attention) and which full attention:
    full    every layer full attention (`full_attention_interval` 1);
    hybrid  the published pattern: three Gated DeltaNet layers, then one
            full attention layer (interval 4);
    linear  every layer Gated DeltaNet (interval above the layer count).

  deepseek3_2 (configs/deepseek3_2.py's `small` shape, with `--mla_heads`
  heads and an indexer of `--index_heads` x `--index_head_dim`: by default
  its scores cost about a fifth of dense attention's per key, as
  DeepSeek-V3.2's 64 x 128 indexer does beside 128 heads): multi-head latent
  attention, dense or DeepSeek Sparse Attention:
    dense   every query attends to every earlier token (no indexer);
    sparse  each query attends to the `--index_topk` tokens its indexer
            picks (the indexer scores every earlier token; its KL loss is
            part of the training step, as in training).

For each training length it compiles one forward and backward of the
next-token loss (gradients of every parameter; with an indexer, plus its
loss) per variant and prints the step time (median of `--repeats` calls,
the variants timed in turn round after round so that load from other jobs
falls on all alike) and XLA's compiled scratch memory
(`memory_analysis().temp_size_in_bytes`: the activations kept for the
backward pass and the work buffers). Full attention runs the execution's
attention kernel ("auto": blockwise, O(L) memory, on CPU), so its memory
grows linearly too and its time quadratically.

Then decoding at long context: per variant, `--decode_tokens` greedy tokens
after a `--context`-token prompt; the prefill's own time (generating one
token) is subtracted, leaving tokens/s of the decode steps alone. Full
attention reads a key/value cache as long as the context; Gated DeltaNet
carries a fixed-size state; sparse attention reads the whole cache's
indexer keys but attends to top-k tokens.

  tools/bazel run //tools/bench:long_context_bench -- --family=qwen3_5 \
      --lengths=512,2048,8192 --context=8192
"""

import statistics
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import deepseek3_2
from configs import qwen3_5
from maxtext.common.model_config import ModelConfig
from maxtext.inference import generate
from maxtext.kernels import dispatch
from maxtext.layers import moe
from maxtext.models import execution as execution_lib
from maxtext.models import registry

_FAMILY = flags.DEFINE_enum("family", "qwen3_5", ["qwen3_5", "deepseek3_2"],
                            "Which attentions to compare (module doc).")
_LENGTHS = flags.DEFINE_list(
    "lengths", ["512", "1024", "2048", "4096", "8192", "16384"],
    "Training sequence lengths.")
_VARIANTS = {"qwen3_5": ("full", "hybrid", "linear"),
             "deepseek3_2": ("dense", "sparse")}
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences per training step.")
_NUM_LAYERS = flags.DEFINE_integer("num_layers", 4, "Layers.")
_VOCAB = flags.DEFINE_integer("vocab_size", 4096, "Vocabulary size.")
_CHUNK = flags.DEFINE_integer("linear_chunk", 64,
                              "Tokens per chunk of the gated delta rule.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds.")
_CONTEXT = flags.DEFINE_integer("context", 8192,
                                "Prompt length before decoding (0: skip).")
_DECODE_TOKENS = flags.DEFINE_integer("decode_tokens", 32,
                                      "Tokens decoded after the prompt.")
_ONLY = flags.DEFINE_list("variants", [],
                          "Run only these variants (default: all).")
_INDEX_TOPK = flags.DEFINE_integer(
    "index_topk", 64, "deepseek3_2: tokens each query attends to (sparse).")
_MLA_HEADS = flags.DEFINE_integer("mla_heads", 32,
                                  "deepseek3_2: attention heads.")
_INDEX_HEADS = flags.DEFINE_integer("index_heads", 8,
                                    "deepseek3_2: indexer heads.")
_INDEX_HEAD_DIM = flags.DEFINE_integer("index_head_dim", 64,
                                       "deepseek3_2: indexer head width.")


def _model_config(variant: str) -> ModelConfig:
  if _FAMILY.value == "deepseek3_2":
    model = deepseek3_2.get_config("small").model
    model.update(num_heads=_MLA_HEADS.value, num_kv_heads=_MLA_HEADS.value)
    if variant == "dense":
      model.update(index_topk=0, index_num_heads=0, index_head_dim=0)
    else:
      model.update(index_topk=_INDEX_TOPK.value,
                   index_num_heads=_INDEX_HEADS.value,
                   index_head_dim=_INDEX_HEAD_DIM.value)
  else:
    model = qwen3_5.get_config("small").model
    model.update(full_attention_interval={
        "full": 1, "hybrid": 4, "linear": _NUM_LAYERS.value + 1}[variant])
  model.update(num_layers=_NUM_LAYERS.value, vocab_size=_VOCAB.value)
  return ModelConfig.from_dict(model)


def _model(variant: str) -> nnx.Module:
  execution = execution_lib.Execution(
      attention_kernel=dispatch.Kernel(linear_chunk=_CHUNK.value))
  return registry.create_model(_model_config(variant), rngs=nnx.Rngs(0),
                               execution=execution)


def _compiled_step(model: nnx.Module, length: int):
  """Jitted loss and gradients at `length`, compiled, and its arguments."""
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray(np.random.default_rng(0).integers(
      0, _VOCAB.value, size=(_BATCH.value, length + 1)), jnp.int32)

  def loss(state, tokens):
    # Under nnx.capture, as the train step runs it: what the model sows
    # (the indexer's loss) counts.
    logits, sown = nnx.capture(nnx.merge(graphdef, state),
                               moe.AuxLoss)(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), tokens[:, 1:]).mean() + sum(
            jax.tree.leaves(sown))

  compiled = jax.jit(jax.value_and_grad(loss)).lower(state, tokens).compile()
  return compiled, (state, tokens)


def _timed(fn) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def _train_table(models: dict[str, nnx.Module]) -> None:
  print(f"{'length':>7} {'variant':>7} {'step s':>9} {'tokens/s':>10}"
        f" {'scratch MiB':>12}")
  for length in map(int, _LENGTHS.value):
    steps = {name: _compiled_step(model, length)
             for name, model in models.items()}
    for compiled, args in steps.values():  # Warm up.
      jax.block_until_ready(compiled(*args))
    times = {name: [] for name in steps}
    for _ in range(_REPEATS.value):
      for name, (compiled, args) in steps.items():
        times[name].append(_timed(lambda c=compiled, a=args: c(*a)))
    for name, (compiled, _) in steps.items():
      step_s = statistics.median(times[name])
      scratch = compiled.memory_analysis().temp_size_in_bytes / 2**20
      print(f"{length:>7} {name:>7} {step_s:>9.3f}"
            f" {_BATCH.value * length / step_s:>10,.0f} {scratch:>12,.1f}",
            flush=True)


def _decode_table(models: dict[str, nnx.Module]) -> None:
  context, new = _CONTEXT.value, _DECODE_TOKENS.value
  prompt = np.random.default_rng(1).integers(
      0, _VOCAB.value, size=context).tolist()

  def run(model, tokens):
    return lambda: generate.generate(model, [prompt], max_new_tokens=tokens)

  print(f"decoding {new} tokens after a {context}-token prompt (batch 1):")
  print(f"{'variant':>7} {'prefill s':>10} {'decode tokens/s':>16}")
  for name, model in models.items():
    prefill, whole = run(model, 1), run(model, 1 + new)
    prefill(), whole()  # Compile both.
    prefill_s = statistics.median(_timed(prefill)
                                  for _ in range(_REPEATS.value))
    whole_s = statistics.median(_timed(whole) for _ in range(_REPEATS.value))
    print(f"{name:>7} {prefill_s:>10.3f}"
          f" {new / max(whole_s - prefill_s, 1e-9):>16,.1f}", flush=True)


def main(argv):
  del argv
  models = {name: _model(name) for name in _VARIANTS[_FAMILY.value]
            if not _ONLY.value or name in _ONLY.value}
  cfg = _model_config(_VARIANTS[_FAMILY.value][-1])
  print(f"backend={jax.default_backend()} layers={cfg.num_layers}"
        f" embed={cfg.embed_dim} heads={cfg.attention.num_heads}/"
        f"{cfg.attention.num_kv_heads}x{cfg.attention.head_dim}"
        f" vocab={cfg.vocab_size} batch={_BATCH.value}"
        f" linear_chunk={_CHUNK.value} index_topk={cfg.mla.index_topk}"
        f" indexer={cfg.mla.index_num_heads}x{cfg.mla.index_head_dim}")
  _train_table(models)
  if _CONTEXT.value:
    _decode_table(models)


if __name__ == "__main__":
  app.run(main)
