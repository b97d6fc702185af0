"""Gemma 2: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/gemma2.py`): Gemma's
embeddings, `1 + scale` norms and GELU-tanh gates, plus pre- and post-norms
around attention and MLP, local (sliding window 4096) and global layers
alternating (local first), one rotary base for both, soft-capped attention
logits (50) and output logits (30), queries scaled by
`query_pre_attn_scalar**-0.5`.

This module maps Hugging Face's `Gemma2Config` / `Gemma2ForCausalLM`
checkpoints onto that model.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = hf_params.COMMON_BLOCK_PARAMS + hf_params.SANDWICH_NORMS

HF_MODEL_TYPE = "gemma2"
HF_ARCHITECTURE = "Gemma2ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/gemma2.py holds sizes).
ARCHITECTURE = {"norm_offset": 1.0, "post_norms": True,
                "scale_embeddings": True}

_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Gemma 2 config.

  Args:
    hf_config: `Gemma2Config.to_dict()` or a Gemma 2 `config.json` (without
      `layer_types`, layers alternate local/global starting with local).

  Raises:
    ValueError: an unsupported activation, rotary scaling, or a layer
      pattern other than one global layer every N.
  """
  hf = hf_config
  activation = hf.get("hidden_activation") or hf["hidden_act"]
  if activation not in _ACTIVATIONS:
    raise ValueError(f"Unsupported Gemma 2 activation {activation!r}; "
                     f"supported: {sorted(_ACTIVATIONS)}.")
  fields = hf_params.decoder_fields(hf, tie_embeddings_default=True)
  if fields["rope_scaling"] != "default":
    raise ValueError("Gemma 2 with rope_type "
                     f"{fields['rope_scaling']!r} is not supported.")
  window = hf.get("sliding_window") or 0
  interval = 1
  if window:
    alternating = ["sliding_attention", "full_attention"] * hf[
        "num_hidden_layers"]
    interval = hf_params.global_layer_interval(
        hf.get("layer_types") or alternating[:hf["num_hidden_layers"]])
  return ModelConfig.from_dict(dict(
      family="gemma2",
      **ARCHITECTURE,
      rope_local_theta=fields["rope_theta"],
      sliding_window=window,
      global_layer_interval=interval,
      query_pre_attn_scalar=hf["query_pre_attn_scalar"],
      attn_logit_softcap=hf.get("attn_logit_softcapping") or 0.0,
      final_logit_softcap=hf.get("final_logit_softcapping") or 0.0,
      mlp_activation=_ACTIVATIONS[activation],
      **fields,
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="gelu_pytorch_tanh",
      hidden_activation="gelu_pytorch_tanh",
      query_pre_attn_scalar=hf_params.hf_query_pre_attn_scalar(cfg),
      sliding_window=cfg.pattern.sliding_window or None,
      layer_types=hf_params.hf_layer_types(cfg),
      attn_logit_softcapping=cfg.attention.logit_softcap or None,
      final_logit_softcapping=cfg.final_logit_softcap or None)
