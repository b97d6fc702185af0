"""Qwen 2.5 (dense): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/qwen2_5.py`): Llama's
blocks (pre-norm, SiLU gates, GQA) with a bias on the query, key and value
projections, rotary base 1M, tied output head in 0.5B, 1.5B and 3B.

This module maps Hugging Face's `Qwen2Config` / `Qwen2ForCausalLM`
checkpoints onto that model (Qwen 2 has the same layout).
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (hf_params.COMMON_BLOCK_PARAMS + (hf_params.PRE_MLP_NORM,) +
                   hf_params.QKV_BIASES)

HF_MODEL_TYPE = "qwen2"
HF_ARCHITECTURE = "Qwen2ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/qwen2_5.py holds sizes).
ARCHITECTURE = {"qkv_bias": True, "mlp_activation": "silu"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Qwen 2 / 2.5 config.

  Args:
    hf_config: `Qwen2Config.to_dict()` or a Qwen 2.5 `config.json` (legacy
      keys rope_theta and rope_scaling are understood).

  Raises:
    ValueError: `use_sliding_window=True` (Qwen's windowed layers are the
      upper ones, not a repeating pattern) or an unsupported activation.
  """
  hf = hf_config
  if hf.get("use_sliding_window"):
    raise ValueError("Qwen 2.5 use_sliding_window=True is not supported.")
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported Qwen 2.5 hidden_act {hf['hidden_act']!r}; "
                     "supported: 'silu'.")
  return ModelConfig.from_dict(dict(
      family="qwen2_5",
      **ARCHITECTURE,
      **hf_params.decoder_fields(hf, tie_embeddings_default=False),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="silu", use_sliding_window=False)
