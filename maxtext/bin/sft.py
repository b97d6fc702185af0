r"""Fine-tunes a checkpoint: SFT (full, LoRA, QLoRA), DPO and ORPO on Tunix.

Starts from --load (a converted checkpoint from convert_ckpt, a training
checkpoint or workdir) with the method, data and settings of --config
(configs/sft.py, or configs/dpo.py for DPO/ORPO: this one binary runs every
method on one model; //maxtext/bin:distill runs two). Metrics go to
--workdir/metrics.jsonl (and TensorBoard); rerunning with the same workdir
resumes from its newest Tunix checkpoint. The trained model is written to
--workdir/export (LoRA merged into the base weights), which decode and
convert_ckpt --to_hf read directly; --config.export.hf=true also writes the
Hugging Face folder, --config.export.peft_adapter=true a PEFT adapter.

Example (LoRA on a converted SmolLM2-135M-Instruct, see docs/posttrain.md):

  tools/bazel run //maxtext/bin:sft -- --config=configs/sft.py:smollm2 \
      --load=ckpts/smollm2 --workdir=runs/sft_smollm2 \
      --config.data.files=data/chat_train.jsonl \
      --config.data.eval_files=data/chat_eval.jsonl \
      --config.data.tokenizer=ckpts/smollm2/tokenizer.json \
      --config.data.chat_template=ckpts/smollm2/tokenizer_config.json

Exit status: 0 done; 1 an error, named in one line on stderr.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from maxtext.posttrain import runtime
from maxtext.posttrain import sft
from maxtext.trainers import config_flag
from maxtext.trainers import workdir as workdir_lib

_CONFIG = config_flag.define_config_file(
    "config",
    "Post-training config, e.g. configs/sft.py:lora or configs/dpo.py:orpo;"
    " override fields with --config.<section>.<key>=<value>.")
_LOAD = flags.DEFINE_string(
    "load", None, "The starting checkpoint (sets config.train.load).")
_WORKDIR = flags.DEFINE_string(
    "workdir", None,
    "Output directory; default runs/<config file stem>[_<variant>] under the"
    " directory you run from.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  runtime.run_binary(
      "sft", sft.run, config,
      config_path=config_flags.get_config_filename(flags.FLAGS["config"]),
      load=_LOAD.value, workdir=_WORKDIR.value)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  sys.argv = workdir_lib.resolve_config_argv(sys.argv)
  app.run(main)
