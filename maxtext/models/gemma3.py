"""Gemma 3 (text decoder): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/gemma3.py`): embeddings
scaled by sqrt(embed_dim), RMSNorm with `1 + scale`, q/k norm, pre- and
post-norms around attention and MLP, GELU-tanh gates, five local (sliding
window) layers per global layer, local rotary base 10k, global base 1M
(linearly scaled by 8 in 4b/12b/27b), tied output head.

This module maps Hugging Face's `Gemma3TextConfig` / `Gemma3ForCausalLM`
checkpoints onto that model; the multimodal `Gemma3ForConditionalGeneration`
releases (4b/12b/27b) load their text decoder (its `text_config`, see
`registry.hf_text_config`). Export is always the text-only `Gemma3ForCausalLM`.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (hf_params.COMMON_BLOCK_PARAMS + hf_params.QK_NORMS +
                   hf_params.SANDWICH_NORMS)

HF_MODEL_TYPE = "gemma3_text"
HF_ARCHITECTURE = "Gemma3ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/gemma3.py holds sizes).
ARCHITECTURE = {"norm_offset": 1.0, "post_norms": True, "qk_norm": True,
                "scale_embeddings": True}

# `Gemma3TextConfig` defaults (legacy keys): the multimodal releases'
# config.json store only the `text_config` keys that differ from them.
_HF_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "rope_theta": 1_000_000.0,
    "rope_scaling": None, "rope_local_base_freq": 10_000.0,
    "sliding_window_pattern": 6,
}

_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def _global_layer_interval(hf: Mapping[str, Any]) -> int:
  """Period of the local/global pattern; ValueError if it is not periodic."""
  if "layer_types" not in hf:
    return int(hf["sliding_window_pattern"])
  return hf_params.global_layer_interval(hf["layer_types"])


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Gemma 3 text config.

  Args:
    hf_config: `Gemma3TextConfig.to_dict()`, or a complete text-decoder
      `config.json` (legacy keys rope_theta, rope_local_base_freq,
      rope_scaling and sliding_window_pattern are understood); keys it
      lacks take `Gemma3TextConfig`'s defaults.
  """
  hf = {**_HF_DEFAULTS, **hf_config}
  activation = hf["hidden_activation"]
  if activation not in _ACTIVATIONS:
    raise ValueError(f"Unsupported Gemma 3 hidden_activation {activation!r}; "
                     f"supported: {sorted(_ACTIVATIONS)}.")
  if "rope_parameters" in hf:
    global_rope = hf["rope_parameters"]["full_attention"]
    local_theta = hf["rope_parameters"]["sliding_attention"]["rope_theta"]
  else:
    global_rope = {**(hf["rope_scaling"] or {}), "rope_theta": hf["rope_theta"]}
    local_theta = hf["rope_local_base_freq"]
  return ModelConfig.from_dict(dict(
      family="gemma3",
      **ARCHITECTURE,
      vocab_size=hf["vocab_size"],
      num_layers=hf["num_hidden_layers"],
      embed_dim=hf["hidden_size"],
      mlp_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"],
      num_kv_heads=hf["num_key_value_heads"],
      head_dim=hf["head_dim"],
      tie_embeddings=hf.get("tie_word_embeddings", True),
      norm_eps=hf["rms_norm_eps"],
      rope_local_theta=float(local_theta),
      sliding_window=hf["sliding_window"] or 0,
      global_layer_interval=_global_layer_interval(hf),
      query_pre_attn_scalar=hf["query_pre_attn_scalar"],
      attn_logit_softcap=hf["attn_logit_softcapping"] or 0.0,
      final_logit_softcap=hf["final_logit_softcapping"] or 0.0,
      mlp_activation=_ACTIVATIONS[activation],
      **hf_params.rope_fields(global_rope),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`).

  `rope_parameters` has one entry per layer type (transformers >= 5).
  """
  config = hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                       architecture=HF_ARCHITECTURE)
  config["rope_parameters"] = {
      "full_attention": config["rope_parameters"],
      "sliding_attention": {"rope_type": "default",
                            "rope_theta": cfg.rope.local_theta},
  }
  return dict(
      config,
      hidden_activation="gelu_pytorch_tanh",
      query_pre_attn_scalar=hf_params.hf_query_pre_attn_scalar(cfg),
      sliding_window=cfg.pattern.sliding_window or None,
      layer_types=hf_params.hf_layer_types(cfg),
      attn_logit_softcapping=cfg.attention.logit_softcap or None,
      final_logit_softcapping=cfg.final_logit_softcap or None)
