"""Hugging Face checkpoint folders <-> our converted (Orbax) checkpoints.

`hf_to_orbax(hf_dir, out_dir)` reads `config.json` (the family comes from its
model_type / architectures through `registry.family_from_hf_config`) and the
`*.safetensors` weights, and writes a self-describing converted checkpoint
(`maxtext.checkpoint.params_checkpoint`) in the chosen layout and dtype, with
the tokenizer files, the image preprocessing settings
(`preprocessor_config.json`) and the original `config.json` (as
`hf_config.json`). Multimodal checkpoints of a family with a vision tower
(Gemma 3 `Gemma3ForConditionalGeneration`, 4b/12b/27b) convert whole: text
decoder, tower and projector. Those of other families (Gemma 4) convert
their text decoder: the settings come from `text_config`, the weights from
`model.language_model.*` / `language_model.model.*`, and the vision weights
are skipped (their count is logged).
Quantized checkpoints (FP8 block-scaled DeepSeek-V3, MXFP4 GPT-OSS experts)
are dequantized as each tensor is read (`quantized_weights`). A config that
names multi-token prediction layers whose weights the folder lacks
(transformers saves DeepSeek-V3 without them) converts without them, with a
warning.

`orbax_to_hf(checkpoint, out_dir)` is the inverse: from a converted
checkpoint or a training checkpoint it writes `config.json` (the family's
`hf_config_from_model_config`, with the token ids of the original config when
known), sharded safetensors and the tokenizer files, a folder that
`transformers.AutoModelForCausalLM.from_pretrained` loads (for a model with a
vision tower, `Gemma3ForConditionalGeneration`:
`AutoModelForImageTextToText`).

Memory: HF -> ours builds the model abstract (`nnx.eval_shape`, nothing
allocated) and fills it tensor by tensor from lazily read safetensors, so it
holds the parameters once (in the stored dtype; Orbax saves the whole tree,
two arrays in flight) plus one Hugging Face tensor (a scanned layout stacks
one parameter's layers in place). Ours -> HF holds one parameter at a time:
each is read from the checkpoint when the safetensors writer reaches it
(`LazyParam`) and dropped after; export reads each twice (a first pass plans
the shards from the shapes). Peak RSS above the imports, measured with
`tools/bench/convert_memory.py`:
  SmolLM2-135M (513 MB float32): HF -> ours 668 MB (1.30x the model),
    ours -> HF 434 MB (0.85x);
  random Llama shape (642 MB): 748 MB (1.17x) and 381 MB (0.59x).
"""

from collections.abc import Callable, Mapping
import json
import os
import shutil
from typing import Any

from absl import logging
from flax import nnx

from maxtext.checkpoint import params_checkpoint
from maxtext.checkpoint import quantized_weights
from maxtext.checkpoint import safetensors_io
from maxtext.common import json_file
from maxtext.common import exports
from maxtext.common.model_config import DTYPES
from maxtext.common.model_config import ModelConfig
from maxtext.models import hf_weights
from maxtext.models import registry

HF_CONFIG_FILENAME = "config.json"
# The original config.json, kept in a converted checkpoint.
ORIGINAL_HF_CONFIG_FILENAME = "hf_config.json"
# chat_template.jinja: where transformers 5 keeps the chat template.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json", "chat_template.jinja")
# Copied through both ways with the tokenizer.
# Image preprocessing settings (vision-language models) travel with them.
EXTRA_FILES = TOKENIZER_FILES + ("generation_config.json",
                                 "preprocessor_config.json",
                                 "processor_config.json")
# Keys of the original config.json carried over to an exported one.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


class ConversionError(ValueError):
  """The input cannot be converted; the message names the file or tensor."""


def _read_hf_config(hf_dir: str) -> dict[str, Any]:
  path = os.path.join(hf_dir, HF_CONFIG_FILENAME)
  if not os.path.isfile(path):
    raise ConversionError(f"{hf_dir} has no {HF_CONFIG_FILENAME}; a Hugging "
                          "Face checkpoint folder needs one.")
  try:
    return json_file.read_object(path)
  except json_file.JsonFileError as e:
    raise ConversionError(str(e)) from e


def model_config_from_hf_dir(hf_dir: str) -> ModelConfig:
  """Our `ModelConfig` of the Hugging Face folder's `config.json` (of its
  `text_config` for a multimodal model)."""
  return _model_config(os.path.join(hf_dir, HF_CONFIG_FILENAME),
                       _read_hf_config(hf_dir))


def _model_config(path: str, hf_config: dict[str, Any]) -> ModelConfig:
  """Our `ModelConfig` of `hf_config` (read from `path`, named in errors)."""
  try:
    family = registry.family_from_hf_config(hf_config)
    return registry.model_config_from_hf(family, hf_config)
  except (KeyError, ValueError) as e:
    raise ConversionError(f"{path}: {type(e).__name__}: {e}") from e


def _copy_files(src_dir: str, out_dir: str, names, *, rename=None) -> list[str]:
  copied = []
  for name in names:
    src = os.path.join(src_dir, name)
    if os.path.isfile(src):
      shutil.copyfile(src, os.path.join(out_dir, (rename or {}).get(name,
                                                                    name)))
      copied.append(name)
  return copied


def hf_to_orbax(hf_dir: str, out_dir: str, *, scan_layers: bool = True,
                dtype: str = "float32") -> ModelConfig:
  """Converts a Hugging Face checkpoint folder to a converted checkpoint.

  Args:
    hf_dir: Folder with `config.json` and `*.safetensors` (one file, or
      shards with `model.safetensors.index.json`).
    out_dir: Output folder, written whole or not at all
      (`maxtext.common.exports`): new, empty or an earlier export.
    scan_layers: Store the scanned layout (layers stacked) or the unscanned
      one (a list of blocks).
    dtype: Stored parameter dtype, one of `ModelConfig` DTYPES.

  Returns:
    The stored `ModelConfig`.

  Raises:
    ConversionError: config.json or the weights are missing, refused
      (pickle) or do not fit the architecture; the message names the file or
      tensor.
    exports.ExportTargetError: `out_dir` may not receive the export.
  """
  exports.check_target(out_dir, sources=(hf_dir,))
  hf_config = _read_hf_config(hf_dir)

  def open_weights() -> Mapping[str, Any]:
    try:
      return quantized_weights.dequantized(
          safetensors_io.open_weights(hf_dir), hf_config,
          source=os.path.join(hf_dir, HF_CONFIG_FILENAME))
    except (safetensors_io.WeightsError,
            quantized_weights.QuantizationError) as e:
      raise ConversionError(str(e)) from e

  def write_files(folder: str) -> list[str]:
    copied = _copy_files(hf_dir, folder, EXTRA_FILES)
    _copy_files(hf_dir, folder, [HF_CONFIG_FILENAME],
                rename={HF_CONFIG_FILENAME: ORIGINAL_HF_CONFIG_FILENAME})
    return copied

  return save_hf_weights(hf_config, open_weights, out_dir, source=hf_dir,
                         config_source=os.path.join(hf_dir,
                                                    HF_CONFIG_FILENAME),
                         scan_layers=scan_layers, dtype=dtype,
                         write_files=write_files)


def save_hf_weights(hf_config: dict[str, Any],
                    open_weights: Callable[[], Mapping[str, Any]],
                    out_dir: str, *, source: str, config_source: str,
                    scan_layers: bool, dtype: str,
                    write_files: Callable[[str], list[str]]) -> ModelConfig:
  """Writes the model of `hf_config` holding the Hugging Face weights that
  `open_weights()` gives (read lazily) to `out_dir` as a converted
  checkpoint, with what `write_files(folder)` writes beside it (returns the
  names written). `source` is the input (a folder or file, never
  overwritten) and `config_source` where its config comes from (named in
  errors). See `hf_to_orbax`."""
  exports.check_target(out_dir, sources=(source,))
  if dtype not in DTYPES:
    raise ConversionError(f"dtype={dtype!r} is not one of {DTYPES}.")
  cfg = _model_config(config_source, hf_config).replace(
      scan_layers=scan_layers, param_dtype=dtype)
  weights = open_weights()
  cfg = _without_absent_mtp(cfg, weights, source)
  try:
    model = hf_weights.model_from_hf_weights(cfg, weights)
  except (KeyError, TypeError, ValueError) as e:
    message = e.args[0] if isinstance(e, KeyError) else str(e)
    raise ConversionError(f"Weights in {source} do not fit the {cfg.family} "
                          f"model of its config: {message}") from e
  params = params_checkpoint.model_params(model)
  with exports.writing(out_dir, sources=(source,),
                       kind="converted") as folder:
    params_checkpoint.save_converted(folder, cfg, params)
    written = write_files(folder)
  logging.info("Converted %s (%s, %d tensors) to %s; wrote %s.", source,
               cfg.family, len(weights), out_dir, written or "no extra files")
  return cfg


def _without_absent_mtp(cfg: ModelConfig, weights, hf_dir: str) -> ModelConfig:
  """`cfg` without multi-token prediction when its config.json names
  prediction layers but the weights hold none (transformers saves
  DeepSeek-V3 without them), said in the log."""
  if not cfg.mtp.layers:
    return cfg
  first = f"model.layers.{cfg.num_layers}."
  if any(name.startswith(first) for name in weights):
    return cfg
  logging.warning(
      "%s: config.json names %d multi-token prediction layer(s), but the"
      " weights hold none (no %s*); converting without multi-token"
      " prediction (mtp_layers=0).", hf_dir, cfg.mtp.layers, first)
  return cfg.replace(mtp_layers=0)


def hf_config_dict(cfg: ModelConfig,
                   original: dict[str, Any] | None = None) -> dict[str, Any]:
  """`config.json` of `cfg`, with the token ids of `original` if given."""
  config = registry.family_module(cfg.family).hf_config_from_model_config(cfg)
  for key in TOKEN_ID_KEYS:
    if original and original.get(key) is not None:
      config[key] = original[key]
  return config


def _training_tokenizer(checkpoint: str) -> dict[str, str]:
  """{output name: path} of the tokenizer a training run used, if a file
  (`params_checkpoint.tokenizer_path`)."""
  tokenizer = params_checkpoint.tokenizer_path(checkpoint) or ""
  if tokenizer.endswith(".json") and os.path.isfile(tokenizer):
    return {"tokenizer.json": tokenizer}
  if tokenizer.endswith(".model") and os.path.isfile(tokenizer):
    return {"tokenizer.model": tokenizer}
  return {}


def write_hf_model(model: nnx.Module, out_dir: str, *,
                   original: dict[str, Any] | None = None,
                   max_shard_size: int | str = "5GB") -> list[str]:
  """Writes `model` as Hugging Face safetensors and `config.json` (keeping
  the keys of an `original` config, see `hf_config_dict`), no tokenizer
  files; returns the safetensors files written.

  The first pass reads every parameter before a file is written, so a model
  of unreadable lazy parameters leaves no partial export.
  """
  files = safetensors_io.write_weights(
      out_dir, lambda: hf_weights.iter_hf_weights(model),
      max_shard_size=max_shard_size)
  with open(os.path.join(out_dir, HF_CONFIG_FILENAME), "w",
            encoding="utf-8") as f:
    json.dump(hf_config_dict(model.cfg, original), f, indent=2)
    f.write("\n")
  return files


def orbax_to_hf(checkpoint: str, out_dir: str, *,
                max_shard_size: int | str = "5GB",
                owned: bool = False) -> list[str]:
  """Writes a Hugging Face checkpoint folder from one of ours.

  Args:
    checkpoint: A converted checkpoint, a training checkpoint
      `<workdir>/checkpoints/<step>`, or a workdir (its latest checkpoint).
    out_dir: Output folder, written whole or not at all
      (`maxtext.common.exports`): new, empty or an earlier export.
    max_shard_size: Bytes per safetensors file at most ("5GB", "200MB").
    owned: The caller owns `out_dir` (see `exports.check_target`).

  The output is the family's text model, or its vision-language one
  (`Gemma3ForConditionalGeneration`) for a model with a vision tower.

  Returns:
    The safetensors files written.

  Raises:
    ConversionError: the checkpoint cannot be read (names the path).
    exports.ExportTargetError: `out_dir` may not receive the export.
  """
  checkpoint = os.path.abspath(checkpoint)
  with exports.writing(out_dir, sources=(checkpoint,), kind="hf",
                       owned=owned) as folder:
    files = _orbax_to_hf(checkpoint, folder, out_dir, max_shard_size)
  return [os.path.join(out_dir, os.path.basename(path)) for path in files]


def _orbax_to_hf(checkpoint: str, out_dir: str, target: str,
                 max_shard_size: int | str) -> list[str]:
  """`orbax_to_hf` writing into `out_dir`, the folder that becomes
  `target`."""
  original = None
  original_path = os.path.join(checkpoint, ORIGINAL_HF_CONFIG_FILENAME)
  if os.path.lexists(original_path):
    try:
      original = json_file.read_object(original_path)
    except json_file.JsonFileError as e:
      raise ConversionError(str(e)) from e
  try:
    cfg, params = params_checkpoint.load_params(checkpoint, lazy=True)
    # Each parameter is read when the writer reaches it, and dropped after.
    model = params_checkpoint.model_from_params(cfg, params)
    files = write_hf_model(model, out_dir, original=original,
                           max_shard_size=max_shard_size)
  except params_checkpoint.ParamsCheckpointError as e:
    raise ConversionError(str(e)) from e
  copied = _copy_files(checkpoint, out_dir, EXTRA_FILES)
  if not os.path.exists(
      os.path.join(checkpoint, params_checkpoint.MODEL_CONFIG_FILENAME)):
    for name, path in _training_tokenizer(checkpoint).items():
      shutil.copyfile(path, os.path.join(out_dir, name))
      copied.append(name)
  logging.info("Wrote %s (%s, %d safetensors files; copied %s).", target,
               cfg.family, len(files), copied or "no tokenizer files")
  return files
