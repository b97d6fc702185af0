r"""Our trainer against Google's MaxText on the standard shapes, alternating.

Runs, `--rounds` times and for each `--shapes` and `--dtypes` entry, first
our `perf_compare` and then MaxText's trainer on the same shape
(`shapes.SHAPES`: random tokens; the Llama shapes `tiny` at global batch 8
and `small` at `--small_batch`, MaxText's default decoder; `mixtral-tiny`
and `deepseek-tiny` at global batch 8, MaxText's mixtral and deepseek
decoders, dropless in both: our `moe_impl="dropless"` and MaxText's
`--maxtext_moe`, by default its `sparse_matmul` without megablox) with the
same remat policy (`--remat`) on `--devices` CPU devices (more than one:
fake host devices, with `--parallelism=fsdp` FSDP over all of them in both
programs, MaxText's default mesh; with `expert` all of them on the expert
axis, which splits the experts and the batch in both; MaxText exchanges
tokens with its ring of experts, as XLA:CPU lacks its default
ragged_all_to_all), each in its own process so that both see the same
machine load, and prints both programs' median step time, tokens/s and
compile seconds and the ratios ours over MaxText's of tokens/s (target >=
1.25) and compile seconds (target <= 0.5).

MaxText (PyPI `maxtext`, Python >= 3.12) runs from its own virtualenv
outside this repository, made on first use with `--python` and pip. Its
compile seconds are the tracing, lowering and XLA compilation of its
`train_step` as `jax_log_compiles` reports them, summed over its
compilations (their number is printed too), with a fresh persistent
compilation cache per run (its default, ~/jax_cache, would make a second
run's compilation a cache hit). Ours are `pretrain.prepare`'s lowering
(tracing included) and compilation of its one train step.

Run from the repository root with the dev virtualenv (not under Bazel: it
starts both programs as subprocesses):

  PYTHONPATH=. python tools/bench/maxtext_side_by_side.py --rounds=2
  PYTHONPATH=. python tools/bench/maxtext_side_by_side.py --shapes=small \
      --dtypes=float32 --devices=8 --small_batch=8 --steps=3
  PYTHONPATH=. python tools/bench/maxtext_side_by_side.py \
      --shapes=mixtral-tiny,deepseek-tiny --dtypes=float32 --devices=8 \
      --parallelism=expert --maxtext_moe=dense
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from tools.bench import shapes as shapes_lib

_VENV = flags.DEFINE_string("venv", "/tmp/maxtext_venv",
                            "MaxText's virtualenv (made when missing).")
_PYTHON = flags.DEFINE_string(
    "python", "/root/.pyenv/versions/3.12.1/bin/python",
    "Python >= 3.12 that makes the virtualenv.")
_MAXTEXT_VERSION = flags.DEFINE_string("maxtext_version", "0.2.5",
                                       "MaxText release to install.")
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Alternations.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per run.",
                              lower_bound=2)
_DTYPES = flags.DEFINE_list("dtypes", ["bfloat16", "float32"],
                            "Activation dtypes.")
_SHAPES = flags.DEFINE_list("shapes", ["tiny"],
                            f"Shapes, of {sorted(shapes_lib.SHAPES)}.")
shapes_lib.validate_shapes_flag("shapes")
_SMALL_BATCH = flags.DEFINE_integer("small_batch", 2,
                                    "Global batch of `small`.", lower_bound=1)
_DEVICES = flags.DEFINE_integer(
    "devices", 1, "CPU devices (fake host devices when more than one).",
    lower_bound=1)
_PARALLELISM = flags.DEFINE_enum(
    "parallelism", "fsdp", ["fsdp", "expert"],
    "With more than one device: fsdp splits parameters and batch over all"
    " of them; expert puts all of them on the expert axis (MoE shapes).")
_MAXTEXT_MOE_FLAG = flags.DEFINE_enum(
    "maxtext_moe", "ragged_dot", ["ragged_dot", "megablox", "dense"],
    "MaxText's dropless experts: ragged_dot (jax.lax.ragged_dot, as ours;"
    " not with expert parallelism, where it lacks group offsets), megablox"
    " (its Pallas kernel, interpreted off TPU) or dense (every expert on"
    " every token, weighted).")
# The policies both programs have under one name ("none" is not one: ours
# keeps every activation, MaxText's recomputes them all).
_REMAT = flags.DEFINE_enum(
    "remat", "full", ["full", "minimal", "save_dot_except_mlp",
                      "save_qkv_proj", "save_out_proj"],
    "Remat policy of both programs.")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# MaxText's names (its configs/base.yml) of our model fields.
_MAXTEXT_NAMES = {
    "embed_dim": "base_emb_dim", "num_heads": "base_num_query_heads",
    "num_kv_heads": "base_num_kv_heads", "head_dim": "head_dim",
    "mlp_dim": "base_mlp_dim", "moe_mlp_dim": "base_moe_mlp_dim",
    "num_layers": "base_num_decoder_layers", "vocab_size": "vocab_size",
    "norm_eps": "normalization_layer_epsilon",
    "rope_theta": "rope_max_timescale", "num_experts": "num_experts",
    "num_experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "shared_experts",
    "first_dense_layers": "first_num_dense_layers",
    "num_expert_groups": "n_routing_groups",
    "expert_groups_per_token": "topk_routing_group",
    "routed_scaling_factor": "routed_scaling_factor",
    "router_bias_update_rate": "routed_bias_update_rate",
    "load_balance_loss_weight": "load_balance_loss_weight",
    "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim",
    "rope_scaling_factor": "rope_factor",
    "rope_original_max_length": "original_max_position_embeddings",
    "mtp_layers": "mtp_num_layers"}
# MaxText's dropless MoE implementations (`--maxtext_moe`).
_MAXTEXT_MOE = {
    "ragged_dot": {"sparse_matmul": "true", "megablox": "false"},
    "megablox": {"sparse_matmul": "true", "megablox": "true"},
    "dense": {"sparse_matmul": "false"},
}
# MaxText's model config of an MoE family, whose fields the shape's then
# override, with nothing dropped.
_MOE_DROPLESS = {"override_model_config": "true", "capacity_factor": -1}
# Per family: MaxText's settings, the fields besides the shape's own that
# MaxText gets from ours, and our names that MaxText spells differently in
# that family.
_FAMILIES = {
    "llama3": ({}, (), {}),
    "mixtral": ({"model_name": "mixtral-8x7b", **_MOE_DROPLESS},
                ("norm_eps", "rope_theta", "load_balance_loss_weight"), {}),
    "deepseek3": ({"model_name": "deepseek3-671b", **_MOE_DROPLESS},
                  ("norm_eps", "rope_theta", "load_balance_loss_weight",
                   "routed_scaling_factor", "router_bias_update_rate"),
                  # Our head_dim is the rotary part of MLA's heads.
                  {"head_dim": "qk_rope_head_dim"}),
}
_OURS = re.compile(r"compile ([\d.]+) s, step ([\d.]+) s")
_MAXTEXT_STEP = re.compile(r"completed step: (\d+), seconds: ([\d.]+)")
_MAXTEXT_COMPILE = re.compile(
    r"Finished (?:tracing|jaxpr to MLIR module conversion|XLA compilation"
    r" of) (?:jit\()?train_step\)? .*?in ([\d.e-]+) sec")
_MAXTEXT_XLA = re.compile(r"Finished XLA compilation of jit\(train_step\)")


def ensure_venv() -> str:
  """MaxText's virtualenv python (`--venv`), made with `--python` and pip
  when missing."""
  python = os.path.join(_VENV.value, "bin", "python")
  probe = [python, "-c", "import maxtext, jax"]
  # Without this repository's PYTHONPATH (its own maxtext and packages).
  if os.path.exists(python) and subprocess.run(
      probe, env={**os.environ, "PYTHONPATH": ""}).returncode == 0:
    return python
  subprocess.run([_PYTHON.value, "-m", "venv", _VENV.value], check=True)
  subprocess.run([python, "-m", "pip", "install", "-q",
                  f"maxtext[tpu]=={_MAXTEXT_VERSION.value}"], check=True)
  return python


def base_yml(python: str) -> str:
  """MaxText's configs/base.yml in the virtualenv of `python`."""
  return os.path.join(os.path.dirname(python), "..", "lib", "python3.12",
                      "site-packages", "maxtext", "configs", "base.yml")


def _run(command: list[str], env: dict[str, str]) -> str:
  result = subprocess.run(command, env={**os.environ, **env}, cwd=_REPO,
                          capture_output=True, text=True)
  output = result.stdout + result.stderr
  if result.returncode:
    raise RuntimeError(f"{command[:3]} failed ({result.returncode}):\n"
                       f"{output[-3000:]}")
  return output


def _device_env() -> dict[str, str]:
  """The environment that gives a program `--devices` CPU devices."""
  if _DEVICES.value == 1:
    return {}
  return {"XLA_FLAGS": " ".join([
      os.environ.get("XLA_FLAGS", ""),
      f"--xla_force_host_platform_device_count={_DEVICES.value}"]).strip()}


def _expert_devices() -> int:
  """Devices on the expert axis in both programs."""
  return _DEVICES.value if _PARALLELISM.value == "expert" else 1


def run_ours(shape: str, dtype: str) -> tuple[float, float, int]:
  """(median step seconds, compile seconds, compilations) of our trainer."""
  fsdp = _DEVICES.value > 1 and _PARALLELISM.value == "fsdp"
  output = _run([sys.executable, "-m", "tools.bench.perf_compare",
                 f"--shapes={shape}", f"--dtypes={dtype}",
                 f"--small_batch={_SMALL_BATCH.value}", f"--fsdp={fsdp}",
                 f"--expert={_expert_devices()}", f"--remat={_REMAT.value}",
                 f"--steps={_STEPS.value}"],
                {"PYTHONPATH": _REPO, **_device_env()})
  match = _OURS.search(output)
  if match is None:
    raise RuntimeError(f"No figures in perf_compare's output:\n{output}")
  return float(match.group(2)), float(match.group(1)), 1


def maxtext_settings(shape: str, dtype: str) -> dict[str, object]:
  """MaxText's base.yml overrides for `shape`'s model and data in `dtype`:
  its family's settings and our config's values under MaxText's names."""
  config = shapes_lib.config_dict(shape, dtype, _SMALL_BATCH.value)
  settings, extra_fields, renames = _FAMILIES[config.model.family]
  model_fields = [f for f in shapes_lib.SHAPES[shape] if f != "seq_len"]
  names = {**_MAXTEXT_NAMES, **renames}
  if config.model.num_experts:
    settings = {**settings, **_MAXTEXT_MOE[_MAXTEXT_MOE_FLAG.value]}
  if _expert_devices() > 1:
    # Its default exchange between expert shards, ragged_all_to_all, is not
    # implemented by XLA:CPU; its ring of experts (all-gather the tokens,
    # reduce-scatter the outputs) is what runs here.
    settings = {**settings, "use_ring_of_experts": "true"}
  return {**settings,
          **{names[f]: config.model[f] for f in (*model_fields,
                                                  *extra_fields)},
          "max_target_length": config.data.seq_len, "dtype": dtype,
          "remat_policy": _REMAT.value,
          "ici_expert_parallelism": _expert_devices()}


def run_maxtext(python: str, shape: str,
                dtype: str) -> tuple[float, float, int]:
  """(median step seconds, compile seconds, compilations) of MaxText."""
  steps = _STEPS.value + 2  # Steps 0 and 1 include compilation and warm-up.
  per_device_batch = (shapes_lib.global_batch(shape, _SMALL_BATCH.value)
                      / _DEVICES.value)
  settings = maxtext_settings(shape, dtype)
  with tempfile.TemporaryDirectory() as out:
    output = _run([
        python, "-m", "maxtext.trainers.pre_train.train",
        base_yml(python),
        "run_name=side_by_side", f"base_output_directory={out}",
        # A fresh persistent compilation cache: every run compiles cold.
        f"jax_cache_dir={os.path.join(out, 'jax_cache')}",
        "dataset_type=synthetic", "attention=dot_product",
        "enable_checkpointing=false", "skip_jax_distributed_system=true",
        "enable_tensorboard=false", f"steps={steps}",
        f"per_device_batch_size={per_device_batch:g}",
        *(f"{name}={value}" for name, value in settings.items()),
    ], {"DECOUPLE_GCLOUD": "TRUE", "JAX_LOG_COMPILES": "1",
        "JAX_PLATFORMS": "cpu", **_device_env()})
  step_seconds = {int(s): float(t) for s, t in _MAXTEXT_STEP.findall(output)}
  timed = [t for s, t in step_seconds.items() if s >= 2]
  if not timed:
    raise RuntimeError(f"No step times in MaxText's output:\n"
                       f"{output[-3000:]}")
  compile_s = sum(float(t) for t in _MAXTEXT_COMPILE.findall(output))
  return (statistics.median(timed), compile_s,
          len(_MAXTEXT_XLA.findall(output)))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _expert_devices() > 1 and _MAXTEXT_MOE_FLAG.value == "ragged_dot":
    raise app.UsageError(
        "--maxtext_moe=ragged_dot does not run with --parallelism=expert"
        " (MaxText's ring of experts needs group offsets that"
        " jax.lax.ragged_dot lacks); use megablox or dense.")
  python = ensure_venv()
  print(f"load average before: {os.getloadavg()}")
  for round_index in range(_ROUNDS.value):
    for shape in _SHAPES.value:
      tokens_per_step = (shapes_lib.global_batch(shape, _SMALL_BATCH.value)
                         * shapes_lib.SHAPES[shape]["seq_len"])
      for dtype in _DTYPES.value:
        run = (f"round {round_index + 1} {shape} {dtype} {_DEVICES.value}"
               f" device(s) ({_PARALLELISM.value}), remat {_REMAT.value},"
               f" MaxText MoE {_MAXTEXT_MOE_FLAG.value}")
        ours = run_ours(shape, dtype)
        theirs = run_maxtext(python, shape, dtype)
        for name, (step_s, compile_s, compiles) in (("ours", ours),
                                                    ("maxtext", theirs)):
          print(f"{run} {name}: step {step_s:.4f} s,"
                f" {tokens_per_step / step_s:.1f} tokens/s, compile"
                f" {compile_s:.2f} s in {compiles} compilation(s)")
        print(f"{run} ratios: tokens/s {theirs[0] / ours[0]:.2f}x"
              f" MaxText's, compile time {ours[1] / theirs[1]:.2f}x"
              f" MaxText's; load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
  app.run(main)
