r"""Reinforcement learning with GRPO or GSPO on Tunix (rewards from Python
functions, rollouts from the built-in JAX sampler or vLLM).

Starts from --load (a converted checkpoint from convert_ckpt, a training
checkpoint or workdir), or, with the default config, trains a tiny model
from scratch on a toy task whose mean reward rises within a minute or two on
a CPU. The algorithm, rewards and rollout settings are in --config
(configs/grpo.py). Metrics go to --workdir/metrics.jsonl (train/rewards/sum
is the mean total reward); the trained policy to --workdir/export, which
decode and convert_ckpt --to_hf read.

Examples (see docs/rl.md):

  tools/bazel run //maxtext/bin:grpo -- --config=configs/grpo.py

  tools/bazel run //maxtext/bin:grpo -- --config=configs/grpo.py:smollm2 \
      --load=ckpts/smollm2 --workdir=runs/grpo_smollm2 \
      --config.data.files=data/gsm8k_train.jsonl

Exit status: 0 done; 1 an error, named in one line on stderr.
"""

from maxtext.common import host_memory

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
from maxtext.posttrain import binary
from maxtext.rl import grpo

_FLAGS = binary.define_binary_flags(
    config_help="RL config, e.g. configs/grpo.py or configs/grpo.py:gspo",
    load_help="The starting checkpoint (sets config.train.load).",
    default_workdir="runs/grpo[_<variant>]")

main = binary.binary_main("grpo", grpo.run, _FLAGS)


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-grpo`."""
  binary.start_binary(main)


if __name__ == "__main__":
  console_main()
