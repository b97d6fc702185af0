"""Llama 2: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/llama2.py`): Llama 3's
blocks (pre-norm, SiLU gates, untied output head) with rotary base 10k, a 32k
vocabulary, and multi-head attention (GQA with 8 key/value heads in 70B). The
Hugging Face layout and config keys are Llama 3's (`LlamaConfig` /
`LlamaForCausalLM`). """

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import llama3

MODEL_CLASS = decoder.Decoder

HF_PARAMS = llama3.HF_PARAMS
HF_BLOCK_PARAMS = llama3.HF_BLOCK_PARAMS
HF_MODEL_TYPE = llama3.HF_MODEL_TYPE
HF_ARCHITECTURE = llama3.HF_ARCHITECTURE
ARCHITECTURE = llama3.ARCHITECTURE


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Llama 2 config (see `llama3`)."""
  return llama3.model_config_from_hf(hf_config).replace(family="llama2")


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (Llama's keys)."""
  return llama3.hf_config_from_model_config(cfg)
