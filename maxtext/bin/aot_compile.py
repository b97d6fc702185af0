r"""Compiles the train step for a TPU slice, GPUs or CPUs, from this machine.

Finds out whether a config fits before you pay for the hardware: builds the
same mesh, shardings and train step as `train` on the target's devices
(compile-only TPU devices through libtpu, on a CPU-only host too), compiles
it, and prints per device the argument, output, temporary and total bytes
against the device's memory, XLA's FLOPs next to ours, the estimated step
time and the collectives. Exits with status 1 and says why when the step
does not fit.

  tools/bazel run //maxtext/bin:aot_compile -- \
      --config=configs/llama3.py:8b --topology=v5p-8 \
      --config.mesh.ici.data=1 --config.mesh.ici.fsdp=-1

Topologies: v5e-256, v6e-16 (chips), v4-8, v5p-128 (TensorCores), v5e:2x2,
v5p:4x4x12 (the chip grid), cpu:8, h100:8 and h200:8 (compile-only GPUs, with
jax's CUDA PJRT plugin installed), gpu:8 (attached GPUs) (devices per
host); --num_slices for several slices (the config's mesh.dcn sizes apply) or
GPU hosts.

A post-training config (recognised by its train.method) compiles its
method's step instead, the one its trainer runs (maxtext.posttrain.step),
on the model of the train.load checkpoint's config (no weights are read)
with its LoRA adapters and optimizer: configs/sft.py the sft step,
configs/dpo.py the DPO/ORPO step (the reference's scoring is not part of
it), configs/distill.py the distillation step (the teacher's forward pass
is not part of it; its checkpoint's config gives the outputs' shapes):

  tools/bazel run //maxtext/bin:aot_compile -- --config=configs/sft.py:lora \
      --config.train.load=ckpts/llama3_8b --topology=v5e-16

An RL config (configs/grpo.py, recognised by its rl section) compiles the
GRPO policy update: the actor step of Tunix's GRPOLearner on one batch of
rollout shapes (prompts x rl.num_generations completions of
rollout.max_prompt_length + rollout.max_new_tokens tokens); the sampling is
not part of it:

  tools/bazel run //maxtext/bin:aot_compile -- \
      --config=configs/grpo.py:smollm2 --config.train.load=ckpts/smollm2 \
      --config.data.files=unread.jsonl --topology=v5e-4

--save=FILE writes the compiled step for `train --compiled=FILE` (or, for
an sft config, `sft --compiled=FILE`), which refuses a file compiled for
another config or topology. --sweep compiles
several mesh layouts and remat policies and prints them ranked by fit and
estimated step time.
"""

import sys

from absl import app
from absl import flags

from maxtext.aot import compile_distill
from maxtext.aot import compile_grpo
from maxtext.aot import compile_preference
from maxtext.aot import compile_sft
from maxtext.aot import compile_step
from maxtext.aot import compile_tunix
from maxtext.aot import saved_step
from maxtext.aot import sweep as sweep_lib
from maxtext.aot import topology as topology_lib
from maxtext.common import cli
from maxtext.common import config_flag
from maxtext.common import paths
from maxtext.posttrain.config import PosttrainConfig
from maxtext.rl.config import RlRunConfig
from maxtext.sharding import report as report_lib
from maxtext.trainers.config import ExperimentConfig

_CONFIG = config_flag.define_config_file(
    "config",
    "Config file and optional variant, e.g. configs/llama3.py:8b; override"
    " fields with --config.<section>.<key>=<value>.")
_TOPOLOGY = flags.DEFINE_string(
    "topology", None,
    "Target: v5e-256, v5p-8, v4-8, v6e-16, v5e:2x2, cpu:8, h100:8, h200:8,"
    " gpu:8, ...")
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "TPU slices (or GPU hosts) joined by the network.")
_SAVE = flags.DEFINE_string(
    "save", None,
    "Write the compiled step here, for train --compiled (sft --compiled for"
    " an sft config).")
_PARAMETERS = flags.DEFINE_bool(
    "parameters", False, "Also print the sharding of every parameter.")
_SWEEP = flags.DEFINE_bool(
    "sweep", False,
    "Rank mesh layouts x remat policies instead of compiling the config's.")
_SWEEP_LAYOUTS = flags.DEFINE_multi_string(
    "sweep_layout", [],
    "An ICI layout to sweep, e.g. fsdp=4,tensor=2 (repeat the flag for"
    " more); default: FSDP, FSDP x tensor, data x FSDP over a slice.")
_SWEEP_REMAT = flags.DEFINE_list(
    "sweep_remat", list(sweep_lib.DEFAULT_REMAT_POLICIES),
    "Remat policies to sweep.")


def _sweep(experiment: ExperimentConfig,
           hardware: topology_lib.Hardware) -> None:
  layouts = ([sweep_lib.parse_layout(text) for text in _SWEEP_LAYOUTS.value] or
             sweep_lib.default_layouts(experiment,
                                       hardware.target.devices_per_slice))
  rows = sweep_lib.sweep(experiment, hardware, layouts, _SWEEP_REMAT.value)
  print(sweep_lib.format_table(rows, hardware.memory_name), end="")
  if not any(row.fits for row in rows):
    raise compile_step.DoesNotFitError(
        f"No layout x remat policy fits on {hardware.target.name}."
        f" {compile_step.FIT_HINT}")


def _compile(experiment: ExperimentConfig,
             hardware: topology_lib.Hardware) -> None:
  step = compile_step.compile_train_step(experiment, hardware)
  report = compile_step.analyse(step, experiment)
  if _PARAMETERS.value:
    print(report_lib.parameter_table(experiment.model, dict(step.mesh.shape),
                                     experiment.sharding.param_rules))
  print(compile_step.format_report(report, step), end="")
  compile_step.check_fits(report, hardware.target.name)
  if _SAVE.value:
    path = paths.user_path(_SAVE.value)
    saved_step.save_compiled(path, step, experiment)
    print(f"Saved the compiled step to {path}.")


def _compile_posttrain(config, hardware: topology_lib.Hardware) -> None:
  """Compiles the train step of a post-training config (by its
  train.method) or the GRPO step of an RL one (it has an `rl` section)."""
  if _SWEEP.value or _PARAMETERS.value:
    raise ValueError("--sweep and --parameters work with the train step;"
                     " for the post-training steps drop them.")
  if "rl" in config:
    if _SAVE.value:
      raise ValueError("--save works with the train and sft steps; grpo"
                       " compiles its step itself: drop --save.")
    step = compile_grpo.compile_grpo_step(
        RlRunConfig.from_config_dict(config), hardware)
    title = "GRPO step (Tunix GRPOLearner actor)"
  else:
    posttrain = PosttrainConfig.from_config_dict(config)
    method = posttrain.train.method
    if _SAVE.value and method != "sft":
      raise ValueError(f"--save works with the train and sft steps, not"
                       f" train.method={method!r}: drop --save.")
    compile_fn, title = _POSTTRAIN_STEPS[method]
    step = compile_fn(posttrain, hardware)
  report = compile_tunix.analyse(step)
  print(compile_step.format_report(report, step.step, title=title), end="")
  compile_step.check_fits(report, hardware.target.name)
  if _SAVE.value:
    path = paths.user_path(_SAVE.value)
    compile_sft.save(path, step, posttrain)
    print(f"Saved the compiled step to {path}; train with it: sft"
          f" --compiled={path}.")


# train.method -> (compiles its step, the report's title).
_POSTTRAIN_STEPS = {
    "sft": (compile_sft.compile_sft_step, "Sft step (Tunix PeftTrainer)"),
    "dpo": (compile_preference.compile_preference_step,
            "DPO step (Tunix DPOTrainer)"),
    "orpo": (compile_preference.compile_preference_step,
             "ORPO step (Tunix DPOTrainer)"),
    "distill": (compile_distill.compile_distill_step,
                "Distillation step (Tunix DistillationTrainer)"),
}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _SAVE.value:
    saved_step.disable_compilation_cache()  # Before anything compiles.
  with cli.errors_in_one_line("aot_compile"):
    target = topology_lib.parse_topology(_TOPOLOGY.value, _NUM_SLICES.value)
    topology_lib.configure_backend(target)
    hardware = topology_lib.make_devices(target)
    if "method" in _CONFIG.value.train or "rl" in _CONFIG.value:
      _compile_posttrain(_CONFIG.value, hardware)
      return
    experiment = ExperimentConfig.from_config_dict(_CONFIG.value)
    if _SWEEP.value:
      _sweep(experiment, hardware)
    else:
      _compile(experiment, hardware)


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-aot-compile`."""
  flags.mark_flags_as_required(["config", "topology"])
  sys.argv = paths.resolve_config_argv(sys.argv)
  app.run(main)


if __name__ == "__main__":
  console_main()
