"""Qwen3.5 MoE (text): Qwen3.5's layers (`maxtext.models.qwen3_5`) with
Qwen3-Next's experts (`maxtext.models.qwen3_next`: softmax top-k,
renormalised, and a shared expert scaled by a sigmoid gate) in every layer.

Sizes in `configs/qwen3_5_moe.py`. The checkpoints store each expert's
projections apart (`mlp.experts.{j}.gate_proj.weight`, ...).
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params
from maxtext.models import qwen3_5
from maxtext.models import qwen3_next

MODEL_CLASS = decoder.Decoder

HF_MODEL_TYPE = "qwen3_5_moe_text"
HF_ARCHITECTURE = "Qwen3_5MoeForCausalLM"
HF_SKIPPED_PREFIXES = qwen3_next.HF_SKIPPED_PREFIXES

ARCHITECTURE = qwen3_next.ARCHITECTURE

HF_PARAMS = hf_params.COMMON_PARAMS


def hf_block_params(cfg: ModelConfig) -> tuple[hf_params.ParamMap, ...]:
  """Per-layer entries of `cfg`'s sizes."""
  return (qwen3_next.gated_attention_params(cfg.attention.num_heads,
                                            cfg.attention.head_dim) +
          qwen3_5.linear_projections(cfg) + qwen3_next.EXPERT_PARAMS +
          qwen3_next.SHARED_EXPERT_PARAMS)


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Qwen3.5 MoE text config
  (`Qwen3_5MoeTextConfig.to_dict()`, or a `config.json`'s `text_config`).

  Raises:
    ValueError: as `qwen3_next.linear_fields` and `qwen3_next.moe_fields`.
  """
  hf = dict(hf_config)
  # No dense layer reads it; the experts' width stands in.
  hf.setdefault("intermediate_size", hf["moe_intermediate_size"])
  return ModelConfig.from_dict(dict(
      family="qwen3_5_moe", **ARCHITECTURE, **qwen3_next.linear_fields(hf),
      **qwen3_next.moe_fields(hf),
      **hf_params.decoder_fields(hf, tie_embeddings_default=False)))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  config = qwen3_next.linear_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                       architecture=HF_ARCHITECTURE)
  del config["intermediate_size"]
  return dict(config, **qwen3_next.moe_hf_config(cfg))
