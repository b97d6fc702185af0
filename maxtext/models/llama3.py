"""Llama 3, 3.1 and 3.2: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/llama3.py`): pre-norm
blocks, SiLU gates, GQA, rotary base 500k ("llama3" frequency scaling from 3.1
on), untied output head except in the 3.2 1B/3B models.

This module maps Hugging Face's `LlamaConfig` / `LlamaForCausalLM`
checkpoints onto that model.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = hf_params.COMMON_BLOCK_PARAMS + (hf_params.PRE_MLP_NORM,)

HF_MODEL_TYPE = "llama"
HF_ARCHITECTURE = "LlamaForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/llama3.py holds sizes).
ARCHITECTURE = {"mlp_activation": "silu"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Llama config.

  Args:
    hf_config: `LlamaConfig.to_dict()` or a Llama `config.json` (legacy keys
      rope_theta and rope_scaling are understood).
  """
  hf = hf_config
  for unsupported in ("attention_bias", "mlp_bias"):
    if hf.get(unsupported):
      raise ValueError(f"Llama {unsupported}=True is not supported.")
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported Llama hidden_act {hf['hidden_act']!r}; "
                     "supported: 'silu'.")
  return ModelConfig.from_dict(dict(
      family="llama3",
      **ARCHITECTURE,
      **hf_params.decoder_fields(hf, tie_embeddings_default=False),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="silu", attention_bias=False, mlp_bias=False)
