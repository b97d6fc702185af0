"""Mistral 7B: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/mistral.py`): Llama's
blocks (pre-norm, SiLU gates, GQA, untied output head); v0.1 limits every
layer to a sliding window of 4096 keys (all layers local, with the same rotary
base as global ones), v0.2 and v0.3 have no window.

This module maps Hugging Face's `MistralConfig` / `MistralForCausalLM`
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

HF_MODEL_TYPE = "mistral"
HF_ARCHITECTURE = "MistralForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/mistral.py holds sizes).
ARCHITECTURE = {"mlp_activation": "silu"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Mistral config.

  Args:
    hf_config: `MistralConfig.to_dict()` or a Mistral `config.json` (legacy
      keys rope_theta and rope_scaling are understood).

  Raises:
    ValueError: an unsupported activation, or a sliding window combined with
      rotary scaling (our local layers use plain rotary embeddings).
  """
  hf = hf_config
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported Mistral hidden_act {hf['hidden_act']!r}; "
                     "supported: 'silu'.")
  fields = hf_params.decoder_fields(hf, tie_embeddings_default=False)
  window = hf.get("sliding_window") or 0
  if window and fields["rope_scaling"] != "default":
    raise ValueError("Mistral with a sliding window and rope_type "
                     f"{fields['rope_scaling']!r} is not supported.")
  return ModelConfig.from_dict(dict(
      family="mistral",
      **ARCHITECTURE,
      sliding_window=window,
      # A window applies to every layer: all are local, none is global.
      global_layer_interval=0 if window else 1,
      rope_local_theta=fields["rope_theta"],
      **fields,
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="silu", sliding_window=cfg.pattern.sliding_window or None)
