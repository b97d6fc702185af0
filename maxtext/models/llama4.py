"""Llama 4 (text): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/llama4.py`): pre-norm
blocks whose layers alternate between
- chunked layers: interleaved ("complex") rotary with Llama 3's frequency
  scaling, a weightless RMS norm of queries and keys after it
  (`qk_l2_norm`, Scout; not Maverick), attention within aligned chunks of
  `attention_chunk_size` positions;
- every `global_layer_interval`-th layer a NoPE layer: no rotary, full
  causal attention, queries scaled up with the position (attention
  temperature tuning).
MoE layers (every one in Scout, every second in Maverick:
`moe_layer_interval`) route each token to its top-k experts by logit with
the sigmoid of that logit as its weight, which scales the expert's input
(`router_weights_on_input`), plus one shared expert; the other layers have
a dense MLP of their own width (`mlp_dim`, Hugging Face's
intermediate_size_mlp; the experts' is intermediate_size).

This module maps Hugging Face's `Llama4TextConfig` / `Llama4ForCausalLM`
checkpoints onto that model: experts as fused tensors
`feed_forward.experts.gate_up_proj` [E, D, 2F] (gate, then up) and
`feed_forward.experts.down_proj` [E, F, D], the router
`feed_forward.router`, the shared expert `feed_forward.shared_expert` and a
dense layer's MLP `feed_forward.{gate,up,down}_proj`.

The vision-language model (`Llama4ForConditionalGeneration`: a `text_config`
and a `vision_config`) adds Llama 4's vision tower and pixel-shuffle
projector (`maxtext.layers.vision`, `vision_arch="llama4"`), stored under
`vision_model.` and `multi_modal_projector.` (`HF_VISION_TOWER`); its text
decoder is this model under `language_model.`.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.data import image_tiles
from maxtext.layers import vision as vision_lib
from maxtext.models import decoder
from maxtext.models import hf_params
from maxtext.models import hf_vision_params

MODEL_CLASS = decoder.Decoder


def _linear(path: tuple[str, ...], hf_suffix: str) -> hf_params.ParamMap:
  return hf_params.ParamMap(path, "model.layers.{layer}." + hf_suffix,
                            in_ndim=1)


HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = tuple(
    e for e in hf_params.COMMON_BLOCK_PARAMS if e.path[0] != "mlp") + (
        hf_params.PRE_MLP_NORM,
        _linear(("moe", "router", "kernel"), "feed_forward.router.weight"),
        hf_params.block_param(("moe", "gate_up"),
                              "feed_forward.experts.gate_up_proj",
                              halves=True),
        hf_params.block_param(("moe", "down"),
                              "feed_forward.experts.down_proj"),
    ) + tuple(
        _linear(("moe", "shared", name, "kernel"),
                f"feed_forward.shared_expert.{name}_proj.weight")
        for name in ("gate", "up", "down")) + tuple(
            _linear(("mlp", name, "kernel"),
                    f"feed_forward.{name}_proj.weight")
            for name in ("gate", "up", "down"))

_TOWER = hf_vision_params.SIGLIP_PREFIX
# The vision tower and projector of the vision-language model (our names
# under "model.vision_tower."; the checkpoint's under `HF_VISION_TOWER`).
HF_VISION_PARAMS = (
    hf_params.ParamMap(("vision", "patch_embedding", "kernel"),
                       _TOWER + "patch_embedding.linear.weight", in_ndim=3),
    hf_params.ParamMap(("vision", "class_embedding"),
                       _TOWER + "class_embedding"),
    hf_params.ParamMap(("vision", "position_embedding"),
                       _TOWER + "positional_embedding_vlm"),
) + tuple(
    hf_params.ParamMap(("vision", ours, field), f"{_TOWER}{hf}.{hf_field}")
    for ours, hf in (("pre_norm", "layernorm_pre"),
                     ("post_norm", "layernorm_post"))
    for field, hf_field in (("scale", "weight"), ("bias", "bias"))) + tuple(
        hf_params.ParamMap(("projector", ours, "kernel"), hf, in_ndim=1)
        for ours, hf in (
            ("fc1", _TOWER + "vision_adapter.mlp.fc1.weight"),
            ("fc2", _TOWER + "vision_adapter.mlp.fc2.weight"),
            ("projection", "model.multi_modal_projector.linear_1.weight")))
HF_VISION_LAYER_PARAMS = hf_vision_params.vision_layer_params(
    _TOWER + "model.layers.", ("input_layernorm", "post_attention_layernorm"),
    "o_proj")
HF_VISION_TOWER = "vision_model."

HF_MODEL_TYPE = "llama4_text"
HF_ARCHITECTURE = "Llama4ForCausalLM"
HF_MULTIMODAL_MODEL_TYPE = "llama4"
HF_MULTIMODAL_ARCHITECTURE = "Llama4ForConditionalGeneration"
# transformers' Llama 4 tower: LayerNorms of torch's default epsilon (its
# norm_eps is not read), exact GELU (its hidden_act is not read).
_VISION_FIXED = {"vision_arch": "llama4", "vision_norm_eps": 1e-5,
                 "vision_activation": "gelu"}
# Our `model` key -> its `vision_config` key, and -> its `Llama4Config` key.
_VISION_KEYS = {
    "vision_layers": "num_hidden_layers", "vision_embed_dim": "hidden_size",
    "vision_mlp_dim": "intermediate_size",
    "vision_heads": "num_attention_heads", "vision_patch_size": "patch_size",
    "vision_image_size": "image_size",
    "vision_adapter_dim": "projector_output_dim"}
_MULTIMODAL_KEYS = {"image_token_id": "image_token_index",
                    "image_start_id": "boi_token_index",
                    "image_end_id": "eoi_token_index"}

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/llama4.py holds sizes).
ARCHITECTURE = {
    "mlp_activation": "silu", "rope_interleaved": True,
    # Chunked layers use the one (scaled) rotary; global layers none.
    "rope_local_theta": None, "rope_global_nope": True,
    "router_score": "sigmoid", "router_normalize": False,
    "router_weights_on_input": True, "num_shared_experts": 1,
    "expert_gate_up_fused": True,
}


# The image prompt's tokens besides the placeholder, start and end ids.
_IMAGE_TEXTS = {"x_separator": "<|tile_x_separator|>",
                "y_separator": "<|tile_y_separator|>", "image": "<|image|>"}


def image_prompt_ids(vision: vision_lib.VisionConfig,
                     encode: Callable[[str], list[int]],
                     grid: tuple[int, int]) -> list[int]:
  """The ids an image of `grid` (rows, cols) tiles becomes in a prompt, as
  `Llama4Processor` expands it (`image_tiles.prompt_ids`); `encode` (the
  tokenizer's, special tokens allowed) gives the separators' and
  <|image|>'s ids.

  Raises:
    ValueError: the tokenizer does not have one of those special tokens.
  """
  ids = {"start": vision.image_start_id, "end": vision.image_end_id,
         "patch": vision.image_token_id}
  for name, text in _IMAGE_TEXTS.items():
    encoded = encode(text)
    if len(encoded) != 1:
      raise ValueError(f"The tokenizer encodes {text!r} as {encoded}, not as"
                       " one special token; Llama 4's image prompts need it.")
    ids[name] = encoded[0]
  return image_tiles.prompt_ids(*grid, vision.tokens_per_image, ids)


def _interval(flags: Sequence[bool], what: str, key: str) -> int:
  """N when `flags` is True exactly at layers N-1, 2N-1, ... (0: never)."""
  flags = [bool(flag) for flag in flags]
  if not any(flags):
    return 0
  interval = flags.index(True) + 1
  if flags != [(i + 1) % interval == 0 for i in range(len(flags))]:
    raise ValueError(f"Llama 4 {key}={flags} is not one {what} every N "
                     "layers; other patterns are not supported.")
  return interval


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Llama 4 config: with `text_config` and
  `vision_config` (`Llama4Config`) the vision-language model, else the text
  decoder (`_text_model_config`).

  Raises:
    ValueError: (besides the text decoder's) a vision config whose
      projector widths differ or whose pixel shuffle does not make whole
      windows of patches.
  """
  if hf_config.get("text_config") is None:
    return _text_model_config(hf_config)
  text = _text_model_config(hf_config["text_config"])
  if hf_config.get("vision_config") is None:
    return text
  vision = dict(hf_config["vision_config"])
  widths = {key: vision.get(key) for key in (
      "projector_input_dim", "projector_output_dim", "vision_output_dim")}
  if len(set(widths.values())) != 1:
    raise ValueError(f"Llama 4 vision_config {widths}: these widths must be"
                     " equal.")
  window = 1 / float(vision.get("pixel_shuffle_ratio", 0.5))
  side = vision["image_size"] // vision["patch_size"]
  if not window.is_integer() or side % int(window):
    raise ValueError(f"Llama 4 vision_config pixel_shuffle_ratio="
                     f"{vision.get('pixel_shuffle_ratio')}: 1 / ratio must be"
                     f" a whole number that divides the {side} patches per "
                     "side.")
  rope_parameters = vision.get("rope_parameters") or {}
  return text.replace(**{
      **{ours: vision[key] for ours, key in _VISION_KEYS.items()},
      **{ours: hf_config[key] for ours, key in _MULTIMODAL_KEYS.items()},
      **_VISION_FIXED,
      "mm_tokens_per_image": (side // int(window))**2,
      "vision_rope_theta": float(rope_parameters.get(
          "rope_theta", vision.get("rope_theta", 10_000.0)))})


def _text_model_config(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Llama 4 text config.

  Args:
    hf_config: `Llama4TextConfig.to_dict()`, a Llama 4 text `config.json`,
      or the `text_config` of a Llama 4 multimodal one (legacy rope keys
      understood). Its no_rope_layers (absent: a NoPE layer every
      no_rope_layer_interval) give the chunked/NoPE pattern, its moe_layers
      (absent: every interleave_moe_layer_step-th) the expert layers; its
      router_aux_loss_coef becomes `load_balance_loss_weight`.

  Raises:
    ValueError: attention biases, an activation other than SiLU, no
      experts, NoPE or expert layers that are not one every N, layer_types
      that disagree with no_rope_layers, or rotary layers without an
      attention_chunk_size.
  """
  hf = hf_config
  if hf.get("attention_bias"):
    raise ValueError("Llama 4 attention_bias=True is not supported.")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"Unsupported Llama 4 hidden_act {hf['hidden_act']!r};"
                     " supported: 'silu'.")
  layers = hf["num_hidden_layers"]
  if not hf.get("num_local_experts"):
    raise ValueError(f"Llama 4 num_local_experts="
                     f"{hf.get('num_local_experts')!r}: a Llama 4 model has "
                     "experts (a positive count).")
  rope_layers = hf.get("no_rope_layers") or [
      int((i + 1) % hf.get("no_rope_layer_interval", 4) != 0)
      for i in range(layers)]
  expected_types = ["chunked_attention" if rope else "full_attention"
                    for rope in rope_layers]
  if hf.get("layer_types") and list(hf["layer_types"]) != expected_types:
    raise ValueError(f"Llama 4 layer_types {hf['layer_types']} disagree with"
                     f" no_rope_layers {rope_layers} (a rotary layer is "
                     "chunked, a NoPE layer full attention).")
  nope_interval = _interval([not rope for rope in rope_layers],
                            "NoPE layer", "no_rope_layers")
  chunk = hf.get("attention_chunk_size") or 0
  if nope_interval != 1 and not chunk:
    raise ValueError(f"Llama 4 attention_chunk_size={chunk or None}: "
                     "rotary layers attend within chunks, so give a positive "
                     "size.")
  step = hf.get("interleave_moe_layer_step") or 1
  moe_layers = hf.get("moe_layers")
  moe_interval = step if moe_layers is None else _interval(
      [i in moe_layers for i in range(layers)], "expert layer", "moe_layers")
  fields = hf_params.decoder_fields(hf, tie_embeddings_default=False)
  tuning = hf.get("attn_temperature_tuning", True) and nope_interval > 0
  return ModelConfig.from_dict(dict(
      fields,
      family="llama4",
      **ARCHITECTURE,
      mlp_dim=hf.get("intermediate_size_mlp") or fields["mlp_dim"],
      moe_mlp_dim=hf["intermediate_size"],
      num_experts=hf["num_local_experts"],
      num_experts_per_token=hf.get("num_experts_per_tok", 1),
      moe_layer_interval=moe_interval,
      attention_chunk_size=chunk if nope_interval != 1 else 0,
      global_layer_interval=nope_interval if nope_interval != 1 else 1,
      qk_l2_norm=bool(hf.get("use_qk_norm", True)),
      attn_temperature_scale=float(hf.get("attn_scale", 0.1)) if tuning
      else 0.0,
      attn_temperature_floor_scale=int(hf.get("floor_scale", 8192)),
      load_balance_loss_weight=float(hf.get("router_aux_loss_coef") or 0.0),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`):
  a `Llama4Config` when `cfg` has a vision tower.

  Raises:
    ValueError: `cfg` has sliding windows (Llama 4 has chunks).
  """
  text = _hf_text_config(cfg)
  if not cfg.vision.layers:
    return text
  values = cfg.to_dict()
  return hf_vision_params.multimodal_hf_config(
      cfg, text, model_type=HF_MULTIMODAL_MODEL_TYPE,
      architecture=HF_MULTIMODAL_ARCHITECTURE, vision_config={
          "model_type": "llama4_vision_model", "num_channels": 3,
          "hidden_act": "gelu", "norm_eps": cfg.vision.norm_eps,
          **{key: values[ours] for ours, key in _VISION_KEYS.items()},
          "projector_input_dim": cfg.vision.adapter_dim,
          "vision_output_dim": cfg.vision.adapter_dim,
          "pixel_shuffle_ratio": 1 / cfg.vision.window,
          "rope_parameters": {"rope_type": "default",
                              "rope_theta": cfg.vision.rope_theta}},
      token_keys=_MULTIMODAL_KEYS)


def _hf_text_config(cfg: ModelConfig) -> dict[str, Any]:
  """The text decoder's `Llama4TextConfig` dict."""
  if cfg.pattern.sliding_window:
    raise ValueError(f"Llama 4 has no sliding windows (sliding_window="
                     f"{cfg.pattern.sliding_window}); use "
                     "attention_chunk_size.")
  rope_layers = [int(chunk is not None)
                 for chunk in cfg.pattern.chunks(cfg.num_layers)]
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      intermediate_size=cfg.moe.mlp_dim, intermediate_size_mlp=cfg.mlp.dim,
      hidden_act="silu", attention_bias=False,
      num_local_experts=cfg.moe.num_experts,
      num_experts_per_tok=cfg.moe.num_experts_per_token,
      interleave_moe_layer_step=cfg.pattern.moe_layer_interval,
      moe_layers=[i for i in range(cfg.num_layers) if cfg.moe_layer(i)],
      no_rope_layers=rope_layers,
      layer_types=["chunked_attention" if rope else "full_attention"
                   for rope in rope_layers],
      attention_chunk_size=cfg.pattern.attention_chunk_size or None,
      use_qk_norm=cfg.attention.qk_l2_norm,
      attn_temperature_tuning=cfg.attention.temperature_scale > 0,
      attn_scale=cfg.attention.temperature_scale or 0.1,
      floor_scale=cfg.attention.temperature_floor_scale,
      router_aux_loss_coef=cfg.moe.load_balance_loss_weight)
