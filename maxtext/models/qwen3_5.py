"""Qwen3.5 (text): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/qwen3_5.py`): Qwen3-
Next's layers (`maxtext.models.qwen3_next`: three Gated DeltaNet layers then
one gated full attention layer with partial rotary, zero-centred norms)
with a dense SwiGLU MLP in every layer; `qwen3_5_moe` has Qwen3-Next's
experts instead.

Qwen3.5 releases are vision-language models (`Qwen3_5ForConditionalGeneration`):
their text decoder loads (names under `model.language_model.`; the vision
tower and the multi-token prediction module are skipped). Its rotary is
multimodal (interleaved sections of time, height and width positions), which
for text, all three positions being the token's, is the plain rotary. Unlike
Qwen3-Next, a Gated DeltaNet layer stores its input projections one tensor
each, but the query, key and value projections as one, `in_proj_qkv`.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params
from maxtext.models import qwen3_next

MODEL_CLASS = decoder.Decoder

HF_MODEL_TYPE = "qwen3_5_text"
HF_ARCHITECTURE = "Qwen3_5ForCausalLM"
HF_SKIPPED_PREFIXES = qwen3_next.HF_SKIPPED_PREFIXES

ARCHITECTURE = qwen3_next.ARCHITECTURE

HF_PARAMS = hf_params.COMMON_PARAMS


def linear_projections(cfg: ModelConfig) -> tuple[hf_params.ParamMap, ...]:
  """A Qwen3.5 Gated DeltaNet layer's input projections and the rest of
  its entries."""
  qkv = "linear_attn.in_proj_qkv.weight"
  spans = qwen3_next.conv_spans(cfg)

  def entry(name, hf_suffix, rows=None):
    return hf_params.block_param(("linear_attention", name, "kernel"),
                                 hf_suffix, in_ndim=1, rows=rows)

  return (entry("query", qkv, (1, *spans[0])),
          entry("key", qkv, (1, *spans[1])),
          entry("value", qkv, (1, *spans[2])),
          entry("gate", "linear_attn.in_proj_z.weight"),
          entry("beta", "linear_attn.in_proj_b.weight"),
          entry("decay", "linear_attn.in_proj_a.weight"),
          *qwen3_next.deltanet_params(spans))


def hf_block_params(cfg: ModelConfig) -> tuple[hf_params.ParamMap, ...]:
  """Per-layer entries of `cfg`'s sizes."""
  return (qwen3_next.gated_attention_params(cfg.attention.num_heads,
                                            cfg.attention.head_dim) +
          linear_projections(cfg) + hf_params.COMMON_BLOCK_PARAMS[5:])


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Qwen3.5 text config
  (`Qwen3_5TextConfig.to_dict()`, or a `config.json`'s `text_config`).

  Raises:
    ValueError: as `qwen3_next.linear_fields`.
  """
  hf = hf_config
  return ModelConfig.from_dict(dict(
      family="qwen3_5", **ARCHITECTURE, **qwen3_next.linear_fields(hf),
      **hf_params.decoder_fields(hf, tie_embeddings_default=False)))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return qwen3_next.linear_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                     architecture=HF_ARCHITECTURE)
