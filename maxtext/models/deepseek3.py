"""DeepSeek-V3 (and Kimi K2): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/deepseek3.py`): pre-norm
blocks with multi-head latent attention (`maxtext.layers.mla`: low-rank
queries, a compressed key/value latent, decoupled interleaved rotary with YaRN
scaling), the first `first_dense_layers` blocks with a dense SwiGLU MLP and
the others with a mixture of experts (`maxtext.layers.moe`): sigmoid router
scores with a per-expert selection bias, group-limited top-k, normalised
weights times `routed_scaling_factor`, plus shared experts. Untied output
head. Optional multi-token prediction modules (`maxtext.models.mtp`).

This module maps Hugging Face's `DeepseekV3Config` /
`DeepseekV3ForCausalLM` checkpoints onto that model. Hugging Face layers
0..first_k_dense_replace-1 are our `dense_blocks`, the rest our `blocks`;
the multi-token prediction module of depth k is Hugging Face layer
num_hidden_layers + k - 1 (`model.layers.61.*` in DeepSeek-V3's checkpoint,
which transformers ignores): its decoder layer under the usual names plus
enorm, hnorm, eh_proj and shared_head.norm, with copies of the embedding
and output head (embed_tokens, shared_head.head) that we share.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

_ATTENTION_PARAMS = tuple(
    hf_params.ParamMap(("attention",) + path,
                       "model.layers.{layer}.self_attn." + name,
                       in_ndim=in_ndim)
    for path, name, in_ndim in (
        (("query", "kernel"), "q_proj.weight", 1),
        (("query_down", "kernel"), "q_a_proj.weight", 1),
        (("query_norm", "scale"), "q_a_layernorm.weight", 0),
        (("query_up", "kernel"), "q_b_proj.weight", 1),
        (("kv_down", "kernel"), "kv_a_proj_with_mqa.weight", 1),
        (("kv_norm", "scale"), "kv_a_layernorm.weight", 0),
        (("kv_up", "kernel"), "kv_b_proj.weight", 1),
        (("output", "kernel"), "o_proj.weight", 2),
    ))
_SHARED_EXPERTS = tuple(
    hf_params.ParamMap(("moe", "shared", name, "kernel"),
                       f"model.layers.{{layer}}.mlp.shared_experts."
                       f"{name}_proj.weight", in_ndim=1)
    for name in ("gate", "up", "down"))

HF_PARAMS = hf_params.COMMON_PARAMS
HF_BLOCK_PARAMS = (
    (hf_params.block_param(("pre_attention_norm", "scale"),
                           "input_layernorm.weight"),) +
    _ATTENTION_PARAMS + (hf_params.PRE_MLP_NORM,) +
    tuple(e for e in hf_params.COMMON_BLOCK_PARAMS if e.path[0] == "mlp") +
    hf_params.expert_params("mlp", "gate", gate="gate_proj", up="up_proj",
                            down="down_proj") +
    (hf_params.block_param(("moe", "router_bias"),
                           "mlp.gate.e_score_correction_bias"),) +
    _SHARED_EXPERTS)
# A multi-token prediction module (`maxtext.models.mtp.MTP`): its block
# under the block names, and its own norms and projection.
HF_MTP_PARAMS = tuple(
    hf_params.ParamMap(("block",) + e.path, e.hf_name, e.in_ndim, e.flatten)
    for e in HF_BLOCK_PARAMS) + (
        hf_params.block_param(("embed_norm", "scale"), "enorm.weight"),
        hf_params.block_param(("hidden_norm", "scale"), "hnorm.weight"),
        hf_params.ParamMap(("projection", "kernel"),
                           "model.layers.{layer}.eh_proj.weight", in_ndim=1),
        hf_params.block_param(("final_norm", "scale"),
                              "shared_head.norm.weight"),
    )
# Per-module copies of whole-model parameters: HF name -> our entry.
HF_MTP_COPIES = (
    ("model.layers.{layer}.embed_tokens.weight", HF_PARAMS[0]),
    ("model.layers.{layer}.shared_head.head.weight", HF_PARAMS[2]),
)

HF_MODEL_TYPE = "deepseek_v3"
HF_ARCHITECTURE = "DeepseekV3ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/deepseek3.py holds sizes).
ARCHITECTURE = {"mlp_activation": "silu", "attention_type": "mla",
                "router_score": "sigmoid", "router_bias": True}


def mla_moe_fields(hf: Mapping[str, Any], name: str) -> dict[str, Any]:
  """The `ModelConfig` fields that DeepSeek-V2 and V3 configs state alike:
  sizes, rotary, multi-head latent attention and the experts. `name` (e.g.
  "DeepSeek-V3") names the family in errors.

  Raises:
    ValueError: an unsupported activation, attention bias, or
      num_key_value_heads != num_attention_heads.
  """
  if hf["hidden_act"] != "silu":
    raise ValueError(f"Unsupported {name} hidden_act {hf['hidden_act']!r};"
                     " supported: 'silu'.")
  if hf.get("attention_bias"):
    raise ValueError(f"{name} attention_bias=True is not supported.")
  fields = hf_params.decoder_fields(hf, tie_embeddings_default=False)
  if fields["num_kv_heads"] != fields["num_heads"]:
    raise ValueError(
        f"{name} num_key_value_heads={fields['num_kv_heads']} must "
        f"equal num_attention_heads={fields['num_heads']} (MLA).")
  fields["head_dim"] = hf["qk_rope_head_dim"]
  return dict(
      fields,
      q_lora_rank=hf.get("q_lora_rank") or 0,
      kv_lora_rank=hf["kv_lora_rank"],
      qk_nope_head_dim=hf["qk_nope_head_dim"],
      v_head_dim=hf["v_head_dim"],
      num_experts=hf["n_routed_experts"],
      num_experts_per_token=hf["num_experts_per_tok"],
      moe_mlp_dim=hf["moe_intermediate_size"],
      num_shared_experts=hf["n_shared_experts"] or 0,
      first_dense_layers=hf["first_k_dense_replace"],
      router_normalize=bool(hf["norm_topk_prob"]),
      routed_scaling_factor=float(hf["routed_scaling_factor"]),
      load_balance_loss_weight=float(hf.get("aux_loss_alpha") or 0.0))


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face DeepSeek-V3 config.

  Args:
    hf_config: `DeepseekV3Config.to_dict()` or a DeepSeek-V3 / Kimi K2
      `config.json` (legacy keys rope_theta and rope_scaling are
      understood). num_nextn_predict_layers (absent in transformers'
      config) becomes `mtp_layers`, DeepSeek's aux_loss_alpha
      `load_balance_loss_weight`; our training settings without a
      DeepSeek key (router_bias_update_rate, mtp_loss_weight) are read
      under their own names when present (`hf_config_from_model_config`
      writes them), else 0.

  Raises:
    ValueError: an unsupported activation, attention bias, a scoring
      function other than sigmoid or a method other than noaux_tc, or
      num_key_value_heads != num_attention_heads.
  """
  hf = hf_config
  for key, supported in (("scoring_func", "sigmoid"),
                         ("topk_method", "noaux_tc")):
    if hf.get(key, supported) != supported:
      raise ValueError(f"Unsupported DeepSeek-V3 {key}={hf[key]!r}; "
                       f"supported: {supported!r}.")
  return ModelConfig.from_dict(dict(
      family="deepseek3",
      **ARCHITECTURE,
      **mla_moe_fields(hf, "DeepSeek-V3"),
      rope_interleave=bool(hf.get("rope_interleave", True)),
      num_expert_groups=hf["n_group"] or 1,
      expert_groups_per_token=hf["topk_group"] or 1,
      mtp_layers=hf.get("num_nextn_predict_layers") or 0,
      router_bias_update_rate=float(hf.get("router_bias_update_rate") or 0.0),
      mtp_loss_weight=float(hf.get("mtp_loss_weight") or 0.0),
  ))


def mla_moe_hf_config(cfg: ModelConfig, *, model_type: str,
                      architecture: str) -> dict[str, Any]:
  """The `config.json` keys that DeepSeek-V2 and V3 state alike (the
  inverse of `mla_moe_fields`)."""
  config = hf_params.decoder_hf_config(cfg, model_type=model_type,
                                       architecture=architecture)
  del config["head_dim"]  # transformers derives it (qk_rope_head_dim).
  if cfg.rope.scaling == "yarn":  # DeepSeek-V2 and V3: 4096 * 40 = 163840.
    config["max_position_embeddings"] = int(
        cfg.rope.original_max_length * cfg.rope.scaling_factor)
  return dict(
      config, hidden_act="silu", attention_bias=False,
      q_lora_rank=cfg.mla.q_lora_rank or None,
      kv_lora_rank=cfg.mla.kv_lora_rank,
      qk_nope_head_dim=cfg.mla.qk_nope_head_dim,
      qk_rope_head_dim=cfg.attention.head_dim,
      v_head_dim=cfg.mla.v_head_dim,
      n_routed_experts=cfg.moe.num_experts,
      num_experts_per_tok=cfg.moe.num_experts_per_token,
      moe_intermediate_size=cfg.moe.mlp_dim,
      n_shared_experts=cfg.moe.num_shared_experts,
      first_k_dense_replace=cfg.pattern.first_dense_layers,
      norm_topk_prob=cfg.moe.router_normalize,
      routed_scaling_factor=cfg.moe.routed_scaling_factor,
      n_group=cfg.moe.num_expert_groups,
      topk_group=cfg.moe.expert_groups_per_token,
      aux_loss_alpha=cfg.moe.load_balance_loss_weight)


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(
      mla_moe_hf_config(cfg, model_type=HF_MODEL_TYPE,
                        architecture=HF_ARCHITECTURE),
      rope_interleave=cfg.mla.rope_interleave,
      scoring_func="sigmoid", topk_method="noaux_tc",
      num_nextn_predict_layers=cfg.mtp.layers,
      router_bias_update_rate=cfg.moe.router_bias_update_rate,
      mtp_loss_weight=cfg.mtp.loss_weight)
