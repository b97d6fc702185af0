"""Gemma (1): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/gemma.py`): embeddings
scaled by sqrt(embed_dim), RMSNorm with `1 + scale`, GELU-tanh gates, head dim
256 (multi-query attention in 2B), rotary base 10k, tied output head.

This module maps Hugging Face's `GemmaConfig` / `GemmaForCausalLM`
checkpoints onto that model; the weight names are Llama's.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = hf_params.COMMON_BLOCK_PARAMS + (hf_params.PRE_MLP_NORM,)

HF_MODEL_TYPE = "gemma"
HF_ARCHITECTURE = "GemmaForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/gemma.py holds sizes).
ARCHITECTURE = {"norm_offset": 1.0, "scale_embeddings": True}

_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Gemma config.

  Args:
    hf_config: `GemmaConfig.to_dict()` or a Gemma `config.json`; the
      activation is `hidden_activation` when set, else `hidden_act`.
  """
  hf = hf_config
  activation = hf.get("hidden_activation") or hf["hidden_act"]
  if activation not in _ACTIVATIONS:
    raise ValueError(f"Unsupported Gemma activation {activation!r}; "
                     f"supported: {sorted(_ACTIVATIONS)}.")
  return ModelConfig.from_dict(dict(
      family="gemma",
      **ARCHITECTURE,
      mlp_activation=_ACTIVATIONS[activation],
      **hf_params.decoder_fields(hf, tie_embeddings_default=True),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="gelu_pytorch_tanh",
      hidden_activation="gelu_pytorch_tanh")
