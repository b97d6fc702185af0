"""OLMo 3: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/olmo3.py`): Llama's
SiLU gates and rotary, but no input norms: each block normalises the outputs
of attention and MLP before the residual add (post-norms only, as OLMo 2);
RMSNorm of queries and keys over the whole projection (all heads at once,
one scale per head and dim) before rotary; three sliding-window layers (4096
tokens) then one global layer, all sharing one rotary; no biases, untied
output head.

This module maps Hugging Face's `Olmo3Config` / `Olmo3ForCausalLM`
checkpoints onto that model.
"""

from collections.abc import Mapping
import dataclasses
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = hf_params.COMMON_BLOCK_PARAMS + (
    hf_params.POST_ATTENTION_NORM, hf_params.POST_MLP_NORM) + tuple(
        # Hugging Face's norms span the projection: [heads * head_dim].
        dataclasses.replace(entry, flatten=True)
        for entry in hf_params.QK_NORMS)

HF_MODEL_TYPE = "olmo3"
HF_ARCHITECTURE = "Olmo3ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/olmo3.py holds sizes).
ARCHITECTURE = {"pre_norms": False, "post_norms": True, "qk_norm": True,
                "qk_norm_over": "projection", "mlp_activation": "silu"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face OLMo 3 config.

  Args:
    hf_config: `Olmo3Config.to_dict()` or an OLMo 3 `config.json` (without
      `layer_types`, three sliding layers then one global, repeated).

  Raises:
    ValueError: biases, an unsupported activation, or a layer pattern
      other than one global layer every N.
  """
  hf = hf_config
  if hf.get("attention_bias"):
    raise ValueError("OLMo 3 attention_bias=True is not supported.")
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported OLMo 3 hidden_act {hf['hidden_act']!r}; "
                     "supported: 'silu'.")
  layers = hf["num_hidden_layers"]
  layer_types = hf.get("layer_types") or [
      "full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
      for i in range(layers)]
  window, interval = 0, 1  # Every layer global.
  if "sliding_attention" in layer_types:
    window = hf["sliding_window"]
    interval = hf_params.global_layer_interval(layer_types)
  return ModelConfig.from_dict(dict(
      family="olmo3",
      **ARCHITECTURE,
      sliding_window=window,
      global_layer_interval=interval,
      **hf_params.decoder_fields(hf, tie_embeddings_default=False),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="silu", attention_bias=False,
      sliding_window=cfg.pattern.sliding_window or None,
      layer_types=hf_params.hf_layer_types(cfg))
