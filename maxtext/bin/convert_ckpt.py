r"""Converts checkpoints between Hugging Face folders and ours (Orbax).

Hugging Face -> ours: reads config.json and *.safetensors from --hf_dir and
writes a self-describing checkpoint to --out (model_config.json, Orbax
params, tokenizer files). Ours -> Hugging Face (--to_hf): reads a converted
checkpoint or a training checkpoint (<workdir>/checkpoints/<step>, or a
workdir for its latest) and writes config.json, sharded safetensors and the
tokenizer files, loadable by transformers.AutoModelForCausalLM (a
vision-language model: by AutoModelForImageTextToText; docs/multimodal.md).

A GGUF file (llama.cpp's format; --gguf) converts the same way, without
torch or transformers: its metadata becomes the Hugging Face config, its
tensors are dequantized to --dtype and a byte-level BPE tokenizer becomes
tokenizer.json (maxtext.checkpoint.gguf_convert).

Examples:

  tools/bazel run //maxtext/bin:convert_ckpt -- \
      --hf_dir=~/models/Qwen3-0.6B --out=ckpts/qwen3_0.6b --dtype=bfloat16
  tools/bazel run //maxtext/bin:convert_ckpt -- \
      --gguf=SmolLM2-135M-Instruct.Q4_1.gguf --out=ckpts/smollm2
  tools/bazel run //maxtext/bin:convert_ckpt -- --to_hf \
      --checkpoint=runs/gemma3/checkpoints/150 --out=exports/gemma3

--out is written whole or not at all: into a temporary sibling folder,
renamed when complete. It must be new, empty or an earlier export of ours
(replaced), and may not be or lie in a training workdir or the input.

Exit status: 0 done; 1 an error, named in one line on stderr.
"""

from absl import app
from absl import flags
from absl import logging

from maxtext.checkpoint import gguf_convert
from maxtext.checkpoint import hf_convert
from maxtext.common import cli
from maxtext.common import paths

_HF_DIR = flags.DEFINE_string(
    "hf_dir", None, "Hugging Face folder (config.json + *.safetensors).")
_GGUF = flags.DEFINE_string(
    "gguf", None, "A GGUF file (llama.cpp: llama, qwen2 or qwen3; F32, F16,"
    " BF16, Q8_0, Q4_0 or Q4_1 tensors) to convert instead of --hf_dir.")
_OUT = flags.DEFINE_string("out", None, "Output folder.")
_TO_HF = flags.DEFINE_bool(
    "to_hf", False, "Convert --checkpoint to a Hugging Face folder.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "With --to_hf: a converted checkpoint, a training "
    "checkpoint <workdir>/checkpoints/<step>, or a workdir (latest step).")
_SCAN_LAYERS = flags.DEFINE_bool(
    "scan_layers", True, "Store the scanned layout (layers stacked).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Stored parameter dtype.")
_MAX_SHARD_SIZE = flags.DEFINE_string(
    "max_shard_size", "5GB", "With --to_hf: most bytes per safetensors file.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  out = paths.user_path(_OUT.value)
  if _TO_HF.value:
    if not _CHECKPOINT.value or _HF_DIR.value:
      raise app.UsageError("--to_hf needs --checkpoint (and no --hf_dir).")
    checkpoint = paths.user_path(_CHECKPOINT.value)
    logging.info("Exporting %s to Hugging Face folder %s.", checkpoint, out)
    with cli.errors_in_one_line("convert_ckpt"):
      hf_convert.orbax_to_hf(checkpoint, out,
                             max_shard_size=_MAX_SHARD_SIZE.value)
  elif _GGUF.value:
    if _HF_DIR.value or _CHECKPOINT.value:
      raise app.UsageError("--gguf converts one file: drop --hf_dir and"
                           " --checkpoint.")
    path = paths.user_path(_GGUF.value)
    logging.info("Converting %s to %s.", path, out)
    with cli.errors_in_one_line("convert_ckpt"):
      gguf_convert.gguf_to_orbax(path, out, scan_layers=_SCAN_LAYERS.value,
                                 dtype=_DTYPE.value)
  else:
    if not _HF_DIR.value or _CHECKPOINT.value:
      raise app.UsageError(
          "Give --hf_dir or --gguf (or --to_hf with --checkpoint).")
    hf_dir = paths.user_path(_HF_DIR.value)
    logging.info("Converting %s to %s.", hf_dir, out)
    with cli.errors_in_one_line("convert_ckpt"):
      hf_convert.hf_to_orbax(hf_dir, out, scan_layers=_SCAN_LAYERS.value,
                             dtype=_DTYPE.value)


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-convert-ckpt`."""
  flags.mark_flag_as_required("out")
  app.run(main)


if __name__ == "__main__":
  console_main()
