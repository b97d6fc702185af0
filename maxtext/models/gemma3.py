"""Gemma 3 (text decoder): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/gemma3.py`): embeddings
scaled by sqrt(embed_dim), RMSNorm with `1 + scale`, q/k norm, pre- and
post-norms around attention and MLP, GELU-tanh gates, five local (sliding
window) layers per global layer, local rotary base 10k, global base 1M
(linearly scaled by 8 in 4b/12b/27b), tied output head.

The vision-language releases (4b/12b/27b, `Gemma3ForConditionalGeneration`)
add a SigLIP tower and the pooling projector (`maxtext.layers.vision`:
896 x 896 images, 14-pixel patches, 256 soft tokens per image at the
`image_token_id` placeholders, attending to each other bidirectionally).

This module maps Hugging Face's checkpoints onto that model both ways: a
`Gemma3TextConfig` / `Gemma3ForCausalLM` is the text model, a `Gemma3Config`
/ `Gemma3ForConditionalGeneration` the vision-language one (its text
decoder under `model.language_model`); a model without a tower exports as
`Gemma3ForCausalLM`, one with a tower as `Gemma3ForConditionalGeneration`.
"""

from collections.abc import Callable, Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.layers import vision as vision_lib
from maxtext.models import decoder
from maxtext.models import hf_params
from maxtext.models import hf_vision_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (hf_params.COMMON_BLOCK_PARAMS + hf_params.QK_NORMS +
                   hf_params.SANDWICH_NORMS)

# The tower and the projector of the vision-language model.
HF_VISION_PARAMS = hf_vision_params.SIGLIP_PARAMS + (
    hf_params.ParamMap(("projector", "projection", "kernel"),
                       "model.multi_modal_projector."
                       "mm_input_projection_weight"),
    hf_params.ParamMap(("projector", "norm", "scale"),
                       "model.multi_modal_projector.mm_soft_emb_norm.weight"),
)
HF_VISION_LAYER_PARAMS = hf_vision_params.SIGLIP_LAYER_PARAMS

HF_MODEL_TYPE = "gemma3_text"
HF_ARCHITECTURE = "Gemma3ForCausalLM"
HF_MULTIMODAL_MODEL_TYPE = "gemma3"
HF_MULTIMODAL_ARCHITECTURE = "Gemma3ForConditionalGeneration"

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

# The chat template of the instruction-tuned releases
# (`maxtext.data.chat_template.TEMPLATES`).
CHAT_TEMPLATE = "gemma"


def image_prompt_ids(vision: vision_lib.VisionConfig,
                     encode: Callable[[str], list[int]],
                     grid: None = None) -> list[int]:
  """The ids one image becomes in a prompt, as `Gemma3Processor` expands
  it: "\n\n", <start_of_image>, one placeholder per soft token,
  <end_of_image>, "\n\n" (`encode`: the tokenizer's, no BOS; `grid`: every
  image is one, None)."""
  del grid
  newlines = encode("\n\n")
  return (newlines + [vision.image_start_id] +
          [vision.image_token_id] * vision.tokens_per_image +
          [vision.image_end_id] + newlines)


def _global_layer_interval(hf: Mapping[str, Any]) -> int:
  """Period of the local/global pattern; ValueError if it is not periodic."""
  if "layer_types" not in hf:
    return int(hf["sliding_window_pattern"])
  return hf_params.global_layer_interval(hf["layer_types"])


# `SiglipVisionConfig` defaults and `Gemma3Config`'s own.
_HF_VISION_DEFAULTS = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
    "num_attention_heads": 12, "num_channels": 3, "image_size": 224,
    "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
_HF_MULTIMODAL_DEFAULTS = {"mm_tokens_per_image": 256,
                           "image_token_index": 262_144,
                           "boi_token_index": 255_999,
                           "eoi_token_index": 256_000}
_VISION_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh",
                       "gelu_tanh": "gelu_tanh", "gelu": "gelu"}
# Our `model` key -> its `vision_config` key, and -> its `Gemma3Config` key:
# the one statement of the mapping, both ways.
_VISION_KEYS = {
    "vision_layers": "num_hidden_layers", "vision_embed_dim": "hidden_size",
    "vision_mlp_dim": "intermediate_size",
    "vision_heads": "num_attention_heads", "vision_patch_size": "patch_size",
    "vision_image_size": "image_size", "vision_norm_eps": "layer_norm_eps"}
_MULTIMODAL_KEYS = {"mm_tokens_per_image": "mm_tokens_per_image",
                    "image_token_id": "image_token_index",
                    "image_start_id": "boi_token_index",
                    "image_end_id": "eoi_token_index"}
# transformers' attribute names of those ids, which a config may hold too.
_HF_ID_ALIASES = {"image_token_index": "image_token_id",
                  "boi_token_index": "boi_token_id",
                  "eoi_token_index": "eoi_token_id"}


def _vision_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """`ModelConfig` vision fields of a `Gemma3Config` dict."""
  hf = {**_HF_MULTIMODAL_DEFAULTS, **hf_config}
  for index, alias in _HF_ID_ALIASES.items():
    if alias in hf:
      hf[index] = hf[alias]
  vision = {**_HF_VISION_DEFAULTS, **(hf.get("vision_config") or {})}
  activation = vision["hidden_act"]
  if activation not in _VISION_ACTIVATIONS or vision["num_channels"] != 3:
    raise ValueError(
        f"Unsupported Gemma 3 vision_config (hidden_act={activation!r}, "
        f"num_channels={vision['num_channels']}); supported: hidden_act in "
        f"{sorted(_VISION_ACTIVATIONS)}, num_channels 3.")
  return {**{ours: vision[key] for ours, key in _VISION_KEYS.items()},
          **{ours: hf[key] for ours, key in _MULTIMODAL_KEYS.items()},
          "vision_activation": _VISION_ACTIVATIONS[activation]}


# SigLIP's attention-pooling head, which a tower without
# `vision_use_head=False` holds and Gemma 3 never runs.
_POOLING_HEAD = tuple(
    hf_vision_params.SIGLIP_PREFIX + "head." + name for name in (
        "probe", "attention.in_proj_weight", "attention.in_proj_bias",
        "attention.out_proj.weight", "attention.out_proj.bias",
        "layernorm.weight", "layernorm.bias", "mlp.fc1.weight",
        "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"))


def hf_skipped_weights(cfg: ModelConfig) -> frozenset[str]:
  """Names of weights a checkpoint may hold that the model does not use:
  the vision tower's pooling head (transformers' Gemma 3 ignores it too)."""
  return frozenset(_POOLING_HEAD if cfg.vision.layers else ())


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Gemma 3 config.

  Args:
    hf_config: `Gemma3TextConfig.to_dict()`, or a complete text-decoder
      `config.json` (legacy keys rope_theta, rope_local_base_freq,
      rope_scaling and sliding_window_pattern are understood); keys it
      lacks take `Gemma3TextConfig`'s defaults. A multimodal `Gemma3Config`
      (with `text_config`) gives the vision-language model.
  """
  if hf_config.get("text_config") is not None:
    text = _text_model_config(hf_config["text_config"])
    return text.replace(**_vision_fields(hf_config))
  return _text_model_config(hf_config)


def _text_model_config(hf_config: Mapping[str, Any]) -> ModelConfig:
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
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`):
  a `Gemma3Config` when `cfg` has a vision tower.

  `rope_parameters` has one entry per layer type (transformers >= 5).
  """
  text = _hf_text_config(cfg)
  if not cfg.vision.layers:
    return text
  values = cfg.to_dict()
  activation = {"gelu_tanh": "gelu_pytorch_tanh"}.get(
      cfg.vision.activation, cfg.vision.activation)
  return hf_vision_params.multimodal_hf_config(
      cfg, text, model_type=HF_MULTIMODAL_MODEL_TYPE,
      architecture=HF_MULTIMODAL_ARCHITECTURE, vision_config={
          "model_type": "siglip_vision_model", "num_channels": 3,
          "hidden_act": activation, "vision_use_head": False,
          **{key: values[ours] for ours, key in _VISION_KEYS.items()}},
      token_keys=_MULTIMODAL_KEYS)


def _hf_text_config(cfg: ModelConfig) -> dict[str, Any]:
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
