"""Qwen 3 MoE: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/qwen3_moe.py`): Qwen 3's
blocks (q/k norms, GQA, head dim 128, rotary base 1M, untied output head) with
a mixture of experts in place of every MLP: 128 SwiGLU experts, 8 per token,
chosen by softmax over the experts and renormalised (norm_topk_prob) in the
published checkpoints (`maxtext.layers.moe`).

This module maps Hugging Face's `Qwen3MoeConfig` / `Qwen3MoeForCausalLM`
checkpoints onto that model: the router is `mlp.gate`, expert j's
projections `mlp.experts.j.{gate,up,down}_proj`.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (hf_params.COMMON_BLOCK_PARAMS + (hf_params.PRE_MLP_NORM,) +
                   hf_params.QK_NORMS +
                   hf_params.expert_params("mlp", "gate", gate="gate_proj",
                                           up="up_proj", down="down_proj"))

HF_MODEL_TYPE = "qwen3_moe"
HF_ARCHITECTURE = "Qwen3MoeForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/qwen3_moe.py holds sizes).
ARCHITECTURE = {"qk_norm": True, "mlp_activation": "silu"}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Qwen 3 MoE config.

  Args:
    hf_config: `Qwen3MoeConfig.to_dict()` or a Qwen 3 MoE `config.json`
      (legacy keys rope_theta and rope_scaling are understood). Its
      router_aux_loss_coef becomes `load_balance_loss_weight`.

  Raises:
    ValueError: dense layers among the experts (decoder_sparse_step != 1 or
      mlp_only_layers), attention_bias, use_sliding_window or an unsupported
      activation.
  """
  hf = hf_config
  for unsupported in ("attention_bias", "use_sliding_window",
                      "mlp_only_layers"):
    if hf.get(unsupported):
      raise ValueError(f"Qwen 3 MoE {unsupported}={hf[unsupported]!r} is not "
                       "supported.")
  if hf.get("decoder_sparse_step", 1) != 1:
    raise ValueError("Qwen 3 MoE decoder_sparse_step="
                     f"{hf['decoder_sparse_step']} is not supported; only 1 "
                     "(experts in every layer).")
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported Qwen 3 MoE hidden_act "
                     f"{hf['hidden_act']!r}; supported: 'silu'.")
  return ModelConfig.from_dict(dict(
      family="qwen3_moe",
      **ARCHITECTURE,
      # transformers >= 5 writes num_local_experts; checkpoints num_experts.
      num_experts=hf.get("num_experts") or hf["num_local_experts"],
      num_experts_per_token=hf["num_experts_per_tok"],
      moe_mlp_dim=hf["moe_intermediate_size"],
      router_normalize=bool(hf.get("norm_topk_prob", False)),
      load_balance_loss_weight=hf.get("router_aux_loss_coef", 0.0),
      **hf_params.decoder_fields(hf, tie_embeddings_default=False),
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      hidden_act="silu", attention_bias=False, use_sliding_window=False,
      num_experts=cfg.moe.num_experts,
      num_experts_per_tok=cfg.moe.num_experts_per_token,
      moe_intermediate_size=cfg.moe.mlp_dim,
      norm_topk_prob=cfg.moe.router_normalize, decoder_sparse_step=1,
      mlp_only_layers=[], router_aux_loss_coef=cfg.moe.load_balance_loss_weight)
