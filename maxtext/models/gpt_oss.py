"""GPT-OSS: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/gpt_oss.py`): pre-norm
blocks alternating a sliding-window layer (128 tokens, even layers) and a
full-attention layer (odd layers), GQA with biases on the query, key, value
and output projections and a learned attention-sink logit per query head
(`maxtext.kernels.attention`); YaRN rotary embeddings on every layer (the
sliding ones too: `rope_local_theta=None`); a mixture of experts in every
block: a router with a bias whose top-k logits are softmaxed (equal to softmax
scores renormalised over the chosen experts), and experts with biases and a
clamped SwiGLU (`maxtext.layers.mlp.clamped_swiglu`).

This module maps Hugging Face's `GptOssConfig` / `GptOssForCausalLM`
checkpoints (the dequantized layout transformers holds in memory and
`save_pretrained` writes) onto that model: the router is `mlp.router`
(weight and bias), the experts are fused tensors
`mlp.experts.{gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias}`
with gate and up interleaved along the last axis of `gate_up_proj`
([..., ::2] gate, [..., 1::2] up), and the sinks `self_attn.sinks`.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder


def _experts(path: str, hf_suffix: str, *,
             interleaved: bool = False) -> hf_params.ParamMap:
  return hf_params.block_param(("moe", path), f"mlp.experts.{hf_suffix}",
                               interleaved=interleaved)


HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (
    hf_params.COMMON_BLOCK_PARAMS + (hf_params.PRE_MLP_NORM,) +
    hf_params.QKV_BIASES + (
        hf_params.block_param(("attention", "output", "bias"),
                              "self_attn.o_proj.bias"),
        hf_params.block_param(("attention", "sinks"), "self_attn.sinks"),
        hf_params.ParamMap(("moe", "router", "kernel"),
                           "model.layers.{layer}.mlp.router.weight",
                           in_ndim=1),
        hf_params.block_param(("moe", "router", "bias"), "mlp.router.bias"),
        _experts("gate_up", "gate_up_proj", interleaved=True),
        _experts("gate_up_bias", "gate_up_proj_bias", interleaved=True),
        _experts("down", "down_proj"),
        _experts("down_bias", "down_proj_bias"),
    ))

HF_MODEL_TYPE = "gpt_oss"
HF_ARCHITECTURE = "GptOssForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/gpt_oss.py holds sizes).
ARCHITECTURE = {
    # YaRN rotary on every layer, sliding ones included.
    "rope_local_theta": None,
    "attention_sinks": True, "mlp_activation": "clamped_swiglu",
    "router_normalize": True, "router_logit_bias": True, "expert_bias": True,
    "expert_gate_up_fused": True,
}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face GPT-OSS config.

  Args:
    hf_config: `GptOssConfig.to_dict()` or a GPT-OSS `config.json` (legacy
      keys rope_theta and rope_scaling are understood). Its layer_types
      (absent: sliding, full, sliding, ...) give the local/global pattern;
      its router_aux_loss_coef becomes `load_balance_loss_weight`.

  Raises:
    ValueError: layer_types that are not one full layer every N, or
      sliding layers without a sliding_window.
  """
  hf = hf_config
  num_layers = hf["num_hidden_layers"]
  layer_types = hf.get("layer_types") or [
      "sliding_attention" if (i + 1) % 2 else "full_attention"
      for i in range(num_layers)]
  window = hf.get("sliding_window") or 0
  interval = hf_params.global_layer_interval(layer_types)
  if not window and interval != 1:
    raise ValueError(f"GPT-OSS layer_types {layer_types} have sliding layers "
                     f"but sliding_window={hf.get('sliding_window')!r}; "
                     "give a positive window or only full_attention layers.")
  bias = bool(hf.get("attention_bias", True))
  return ModelConfig.from_dict(dict(
      family="gpt_oss",
      **ARCHITECTURE,
      qkv_bias=bias,
      attention_output_bias=bias,
      sliding_window=window,
      global_layer_interval=interval,
      num_experts=hf["num_local_experts"],
      num_experts_per_token=hf["num_experts_per_tok"],
      moe_mlp_dim=hf["intermediate_size"],
      load_balance_loss_weight=hf.get("router_aux_loss_coef", 0.0),
      **hf_params.decoder_fields(hf, tie_embeddings_default=False),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  config = dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      intermediate_size=cfg.moe.mlp_dim, hidden_act="silu",
      attention_bias=cfg.attention.qkv_bias,
      sliding_window=cfg.pattern.sliding_window or None,
      layer_types=hf_params.hf_layer_types(cfg),
      num_local_experts=cfg.moe.num_experts,
      num_experts_per_tok=cfg.moe.num_experts_per_token,
      router_aux_loss_coef=cfg.moe.load_balance_loss_weight)
  if cfg.rope.scaling == "yarn":
    config["max_position_embeddings"] = int(
        cfg.rope.original_max_length * cfg.rope.scaling_factor)
  return config
