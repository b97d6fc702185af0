r"""Fine-tunes a checkpoint: SFT (full, LoRA, QLoRA), DPO and ORPO on Tunix.

Starts from --load (a converted checkpoint from convert_ckpt, a training
checkpoint or workdir) with the method, data and settings of --config
(configs/sft.py, or configs/dpo.py for DPO/ORPO: this one binary runs every
method on one model; //maxtext/bin:distill runs two). Metrics go to
--workdir/metrics.jsonl (and TensorBoard); rerunning with the same workdir
resumes from its newest Tunix checkpoint and loads its compiled steps from
JAX's persistent compilation cache (--compilation_cache_dir, by default in the
workdir, as for train, grpo and distill). The trained model is written to
--workdir/export (LoRA merged into the base weights), which decode and
convert_ckpt --to_hf read directly; --config.export.hf=true also writes the
Hugging Face folder, --config.export.peft_adapter=true a PEFT adapter.
--compiled=FILE trains with the sft step `aot_compile --save=FILE` compiled
for the same config and devices, and refuses one compiled for another.

Example (LoRA on a converted SmolLM2-135M-Instruct, see docs/posttrain.md):

  tools/bazel run //maxtext/bin:sft -- --config=configs/sft.py:smollm2 \
      --load=ckpts/smollm2 --workdir=runs/sft_smollm2 \
      --config.data.files=data/chat_train.jsonl \
      --config.data.eval_files=data/chat_eval.jsonl \
      --config.data.tokenizer=ckpts/smollm2/tokenizer.json \
      --config.data.chat_template=ckpts/smollm2/tokenizer_config.json

Exit status: 0 done; 1 an error, named in one line on stderr.
"""

from maxtext.common import host_memory

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
from absl import flags

from maxtext.posttrain import binary
from maxtext.posttrain import sft

_FLAGS = binary.define_binary_flags(
    config_help="Post-training config, e.g. configs/sft.py:lora or"
    " configs/dpo.py:orpo",
    load_help="The starting checkpoint (sets config.train.load).",
    default_workdir="runs/<config file stem>[_<variant>]")

_COMPILED = flags.DEFINE_string(
    "compiled", None,
    "An sft step compiled ahead of time by `aot_compile --save` for this run"
    " (sets config.train.compiled); refused when it was compiled for"
    " another.")


def _compiled_into(config) -> None:
  if _COMPILED.value:
    config.train.compiled = _COMPILED.value


main = binary.binary_main("sft", sft.run, _FLAGS, before_run=_compiled_into)


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-sft`."""
  binary.start_binary(main)


if __name__ == "__main__":
  console_main()
