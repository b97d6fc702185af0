"""GGUF files (llama.cpp) -> our converted checkpoints, without torch or
transformers.

`gguf_to_orbax(path, out_dir)` reads the file with our numpy reader
(`maxtext.checkpoint.gguf_file`), turns its metadata into the Hugging Face
`config.json` of the architecture (`ARCHITECTURES`: llama, also Mistral's
files; qwen2; qwen3) and its tensors, dequantized to float32 as each is
read, into the Hugging Face weights (llama.cpp's row permutation of the
llama query and key projections undone), and writes them as
`hf_convert.hf_to_orbax` writes a Hugging Face folder: in the chosen layout
and `model.param_dtype`, with the config as `hf_config.json`. A byte-level
BPE tokenizer (`tokenizer.ggml.model` "gpt2", the one of SmolLM2, Qwen and
Llama 3 files) becomes `tokenizer.json` (its control tokens special, as
transformers builds it) and `tokenizer_config.json` (chat template, special
tokens); other tokenizer models are not converted (a warning says so: give
the run `data.tokenizer`).

Refused with a `GgufError` naming the value: an architecture, tensor type
or tokenizer piece we do not read, a tensor no mapping names, rope scaling
(`rope.scaling.type`, Llama 3.1's `rope_freqs`), and the file's own defects
(`gguf_file`).
"""

from collections.abc import Iterator, Mapping
import json
import os

from absl import logging
import numpy as np
from tokenizers import AddedToken
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import processors

from maxtext.checkpoint import gguf_file
from maxtext.checkpoint import hf_convert
from maxtext.common.model_config import ModelConfig

GgufError = gguf_file.GgufError

# GGUF architecture -> (Hugging Face class, model_type).
ARCHITECTURES = {"llama": ("LlamaForCausalLM", "llama"),
                 "qwen2": ("Qwen2ForCausalLM", "qwen2"),
                 "qwen3": ("Qwen3ForCausalLM", "qwen3")}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                   "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
# Tensors of block i, "blk.{i}.<key>" -> "model.layers.{i}.<value>".
_BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# ggml token types: 3 control (special), 4 user defined (added).
_CONTROL, _USER_DEFINED = 3, 4
# Hugging Face special token -> its GGUF id key, tokenizer.ggml.<key>_token_id.
_SPECIAL_TOKENS = {"bos_token": "bos", "eos_token": "eos",
                   "unk_token": "unknown", "pad_token": "padding"}


def hf_name(name: str, path: str) -> str:
  """The Hugging Face name of GGUF tensor `name` of file `path`."""
  if name in _GLOBAL_TENSORS:
    return _GLOBAL_TENSORS[name]
  parts = name.split(".", 2)
  if (len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit()
      and parts[2] in _BLOCK_TENSORS):
    return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}"
  if name == "rope_freqs.weight":
    raise GgufError(f"{path} scales its rope by tensor rope_freqs.weight"
                    " (Llama 3.1 style), which is not read from GGUF yet.")
  raise GgufError(f"{path}: tensor {name!r} is not one we map; mapped:"
                  f" {sorted(_GLOBAL_TENSORS)} and blk.<i>."
                  f"{{{', '.join(sorted(_BLOCK_TENSORS))}}}.")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's permutation of a llama query/key projection's rows
  (per head, rotary halves interleaved back into two halves)."""
  half = w.shape[0] // heads // 2
  return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


class GgufWeights(Mapping):
  """The file's tensors by Hugging Face name, dequantized to float32 when
  read (one at a time)."""

  def __init__(self, file: gguf_file.GgufFile, arch: str, heads: int,
               kv_heads: int):
    self._file, self._arch = file, arch
    self._heads = {"self_attn.q_proj.weight": heads,
                   "self_attn.k_proj.weight": kv_heads}
    self._names = {hf_name(name, file.path): name for name in file.tensors}

  def __getitem__(self, key: str) -> np.ndarray:
    w = self._file.tensor(self._names[key])
    heads = self._heads.get(key.split(".", 3)[-1])
    if self._arch == "llama" and heads:
      w = _unpermute(w, heads)
    return w

  def __iter__(self) -> Iterator[str]:
    return iter(self._names)

  def __len__(self) -> int:
    return len(self._names)


def hf_config(file: gguf_file.GgufFile) -> dict:
  """The Hugging Face `config.json` of the file's model (see module)."""
  meta = file.metadata
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise GgufError(f"{file.path}: general.architecture={arch!r} is not read;"
                    f" valid: {sorted(ARCHITECTURES)}.")

  def get(key: str, default=None):
    value = meta.get(f"{arch}.{key}", default)
    if value is None:
      raise GgufError(f"{file.path} lacks metadata {arch}.{key}.")
    return value

  scaling = meta.get(f"{arch}.rope.scaling.type", "none")
  if scaling != "none":
    raise GgufError(f"{file.path}: {arch}.rope.scaling.type={scaling!r} is"
                    " not read from GGUF yet; valid: 'none'.")
  cls, model_type = ARCHITECTURES[arch]
  hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
  embed = file.tensors.get("token_embd.weight")
  if embed is None:
    raise GgufError(f"{file.path} has no token_embd.weight tensor.")
  config = {
      "architectures": [cls], "model_type": model_type,
      "hidden_size": hidden,
      "intermediate_size": int(get("feed_forward_length")),
      "num_hidden_layers": int(get("block_count")),
      "num_attention_heads": heads,
      "num_key_value_heads": int(get("attention.head_count_kv", heads)),
      "head_dim": int(get("attention.key_length", hidden // heads)),
      "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
      "rope_theta": float(get("rope.freq_base", 10000.0)),
      "max_position_embeddings": int(get("context_length")),
      "vocab_size": embed.shape[0],
      "tie_word_embeddings": "output.weight" not in file.tensors,
      "hidden_act": "silu",
  }
  for token, key in _SPECIAL_TOKENS.items():
    token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
    if token_id is not None and f"{token}_id" in hf_convert.TOKEN_ID_KEYS:
      config[f"{token}_id"] = int(token_id)
  return config


def write_tokenizer(file: gguf_file.GgufFile, folder: str) -> list[str]:
  """Writes tokenizer.json and tokenizer_config.json of a byte-level BPE
  tokenizer to `folder`; returns the names written (none for another
  tokenizer model, with a warning)."""
  meta = file.metadata
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    logging.warning("%s: tokenizer.ggml.model=%r is not converted (only"
                    " 'gpt2', byte-level BPE); give the run data.tokenizer.",
                    file.path, kind)
    return []
  tokens = meta["tokenizer.ggml.tokens"]
  merges = []
  for merge in meta["tokenizer.ggml.merges"]:
    pair = tuple(merge.split(" "))
    if len(pair) != 2:
      raise GgufError(f"{file.path}: merge {merge!r} is not two pieces"
                      " separated by one space.")
    merges.append(pair)
  tokenizer = Tokenizer(models.BPE(
      vocab={token: i for i, token in enumerate(tokens)}, merges=merges,
      dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
      fuse_unk=False))
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
      add_prefix_space=bool(meta.get("tokenizer.ggml.add_space_prefix",
                                     False)))
  tokenizer.decoder = decoders.ByteLevel()
  types = meta.get("tokenizer.ggml.token_type", [])
  tokenizer.add_special_tokens([
      AddedToken(tokens[i], special=True, normalized=False)
      for i, kind in enumerate(types) if kind == _CONTROL])
  tokenizer.add_tokens([AddedToken(tokens[i], normalized=False)
                        for i, kind in enumerate(types)
                        if kind == _USER_DEFINED])
  special = {}
  for token, key in _SPECIAL_TOKENS.items():
    token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
    if token_id is not None and token_id < len(tokens):
      special[token] = tokens[token_id]
  add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
  if add_bos and "bos_token" in special:
    bos = special["bos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1",
        special_tokens=[(bos, tokens.index(bos))])
  else:
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
  tokenizer.save(os.path.join(folder, "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": add_bos, **special}
  if "tokenizer.chat_template" in meta:
    config["chat_template"] = meta["tokenizer.chat_template"]
  with open(os.path.join(folder, "tokenizer_config.json"), "w",
            encoding="utf-8") as f:
    json.dump(config, f, indent=1)
  return ["tokenizer.json", "tokenizer_config.json"]


def gguf_to_orbax(path: str, out_dir: str, *, scan_layers: bool = True,
                  dtype: str = "float32") -> ModelConfig:
  """Converts GGUF file `path` to a converted checkpoint in `out_dir` (see
  the module docstring and `hf_convert.hf_to_orbax`).

  Raises:
    GgufError: the file cannot be read or converted (names the value).
    hf_convert.ConversionError: its weights do not fit the model.
    exports.ExportTargetError: `out_dir` may not receive the export.
  """
  file = gguf_file.GgufFile(path)
  config = hf_config(file)

  def open_weights() -> GgufWeights:
    return GgufWeights(file, file.metadata["general.architecture"],
                       config["num_attention_heads"],
                       config["num_key_value_heads"])

  def write_files(folder: str) -> list[str]:
    with open(os.path.join(folder, hf_convert.ORIGINAL_HF_CONFIG_FILENAME),
              "w", encoding="utf-8") as f:
      json.dump(config, f, indent=1)
    return [hf_convert.ORIGINAL_HF_CONFIG_FILENAME,
            *write_tokenizer(file, folder)]

  return hf_convert.save_hf_weights(
      config, open_weights, out_dir, source=path, config_source=path,
      scan_layers=scan_layers, dtype=dtype, write_files=write_files)
