"""Mixtral: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/mixtral.py`): Mistral's
blocks (pre-norm, GQA, untied output head) with a mixture of experts in place
of every MLP: 8 SwiGLU experts, 2 per token, chosen by softmax over the
experts and renormalised to sum to 1 (`maxtext.layers.moe`).

This module maps Hugging Face's `MixtralConfig` / `MixtralForCausalLM`
checkpoints onto that model: the router is `block_sparse_moe.gate`, expert
j's gate, down and up projections `block_sparse_moe.experts.j.w1`, `w2` and
`w3`.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (hf_params.COMMON_BLOCK_PARAMS + (hf_params.PRE_MLP_NORM,) +
                   hf_params.expert_params("block_sparse_moe", "gate",
                                           gate="w1", up="w3", down="w2"))

HF_MODEL_TYPE = "mixtral"
HF_ARCHITECTURE = "MixtralForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/mixtral.py holds sizes).
ARCHITECTURE = {"mlp_activation": "silu", "router_normalize": True}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Mixtral config.

  Args:
    hf_config: `MixtralConfig.to_dict()` or a Mixtral `config.json` (legacy
      keys rope_theta and rope_scaling are understood). Its
      router_aux_loss_coef becomes `load_balance_loss_weight`.

  Raises:
    ValueError: an unsupported activation, or a sliding window (Mixtral's
      published checkpoints have none).
  """
  hf = hf_config
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported Mixtral hidden_act {hf['hidden_act']!r}; "
                     "supported: 'silu'.")
  if hf.get("sliding_window"):
    raise ValueError(f"Mixtral sliding_window={hf['sliding_window']} is not "
                     "supported; only None.")
  fields = hf_params.decoder_fields(hf, tie_embeddings_default=False)
  return ModelConfig.from_dict(dict(
      family="mixtral",
      **ARCHITECTURE,
      num_experts=hf["num_local_experts"],
      num_experts_per_token=hf["num_experts_per_tok"],
      moe_mlp_dim=hf["intermediate_size"],
      load_balance_loss_weight=hf.get("router_aux_loss_coef", 0.0),
      **fields,
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      intermediate_size=cfg.moe.mlp_dim, hidden_act="silu",
      sliding_window=None, num_local_experts=cfg.moe.num_experts,
      num_experts_per_tok=cfg.moe.num_experts_per_token,
      router_aux_loss_coef=cfg.moe.load_balance_loss_weight)
