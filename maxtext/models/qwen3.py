"""Qwen 3 (dense): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/qwen3.py`): Llama's
blocks (pre-norm, SiLU gates, GQA) with RMSNorm over the head dim of queries
and keys (before rotary), no projection biases, head dim 128, rotary base 1M,
tied output head in 0.6B, 1.7B and 4B.

This module maps Hugging Face's `Qwen3Config` / `Qwen3ForCausalLM`
checkpoints onto that model.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (hf_params.COMMON_BLOCK_PARAMS + (hf_params.PRE_MLP_NORM,) +
                   hf_params.QK_NORMS)

HF_MODEL_TYPE = "qwen3"
HF_ARCHITECTURE = "Qwen3ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/qwen3.py holds sizes).
ARCHITECTURE = {"qk_norm": True, "mlp_activation": "silu"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Qwen 3 config.

  Args:
    hf_config: `Qwen3Config.to_dict()` or a Qwen 3 `config.json` (legacy
      keys rope_theta and rope_scaling are understood).

  Raises:
    ValueError: `attention_bias=True`, `use_sliding_window=True` or an
      unsupported activation.
  """
  hf = hf_config
  for unsupported in ("attention_bias", "use_sliding_window"):
    if hf.get(unsupported):
      raise ValueError(f"Qwen 3 {unsupported}=True is not supported.")
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported Qwen 3 hidden_act {hf['hidden_act']!r}; "
                     "supported: 'silu'.")
  return ModelConfig.from_dict(dict(
      family="qwen3",
      **ARCHITECTURE,
      **hf_params.decoder_fields(hf, tie_embeddings_default=False),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="silu", attention_bias=False,
      use_sliding_window=False)
