"""DeepSeek-V2 and V2-Lite: what differs from DeepSeek-V3 (`deepseek3`).

Architecture (`ARCHITECTURE` below; sizes in `configs/deepseek2.py`): the
blocks of DeepSeek-V3 (multi-head latent attention with decoupled
interleaved rotary and YaRN, the first `first_dense_layers` blocks with a
dense SwiGLU MLP, the others with routed plus shared experts), routed
differently: softmax router scores, no selection bias; V2-Lite's plain
greedy top-k ("greedy"), or V2's group-limited greedy top-k whose groups
each score their best expert ("group_limited_greedy"; V3's groups score the
sum of their best two); the chosen scores, normalised only where
norm_topk_prob says so (False in DeepSeek's configs), times
`routed_scaling_factor`. V2-Lite has no low-rank queries (q_lora_rank
null). No multi-token prediction.

The attention's softmax scale is qk_head_dim^-0.5 times YaRN's
mscale(factor, mscale_all_dim)^2, as in DeepSeek's own modeling code and
transformers >= 5.13 (transformers 5.12's DeepseekV2Attention leaves the
mscale out; our tests' tiny YaRN model sets mscale_all_dim 0, where all
agree).

Checkpoints use DeepSeek-V3's names without `e_score_correction_bias`.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import deepseek3

MODEL_CLASS = decoder.Decoder

HF_PARAMS = deepseek3.HF_PARAMS
HF_BLOCK_PARAMS = tuple(e for e in deepseek3.HF_BLOCK_PARAMS
                        if e.path != ("moe", "router_bias"))

HF_MODEL_TYPE = "deepseek_v2"
HF_ARCHITECTURE = "DeepseekV2ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/deepseek2.py holds sizes).
ARCHITECTURE = {"mlp_activation": "silu", "attention_type": "mla",
                "router_score": "softmax", "router_bias": False,
                "expert_group_score": "max", "rope_interleave": True}

# DeepSeek-V2's topk_method -> whether it routes within groups.
_TOPK_METHODS = {"greedy": False, "group_limited_greedy": True}


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face DeepSeek-V2 config.

  Args:
    hf_config: `DeepseekV2Config.to_dict()` or a DeepSeek-V2 / V2-Lite
      `config.json` (legacy keys rope_theta and rope_scaling are
      understood). n_group and topk_group count only with
      topk_method "group_limited_greedy"; aux_loss_alpha becomes
      `load_balance_loss_weight`.

  Raises:
    ValueError: an unsupported activation, attention bias, scoring
      function (softmax only), topk_method, moe_layer_freq other than 1, or
      num_key_value_heads != num_attention_heads.
  """
  hf = hf_config
  method = hf.get("topk_method", "greedy")
  if method not in _TOPK_METHODS:
    raise ValueError(f"Unsupported DeepSeek-V2 topk_method={method!r};"
                     f" supported: {sorted(_TOPK_METHODS)}.")
  for key, supported in (("scoring_func", "softmax"), ("moe_layer_freq", 1)):
    if hf.get(key, supported) != supported:
      raise ValueError(f"Unsupported DeepSeek-V2 {key}={hf[key]!r}; "
                       f"supported: {supported!r}.")
  grouped = _TOPK_METHODS[method]
  return ModelConfig.from_dict(dict(
      family="deepseek2",
      **ARCHITECTURE,
      **deepseek3.mla_moe_fields(hf, "DeepSeek-V2"),
      num_expert_groups=(hf["n_group"] or 1) if grouped else 1,
      expert_groups_per_token=(hf["topk_group"] or 1) if grouped else 1,
  ))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  grouped = cfg.moe.num_expert_groups > 1
  return dict(
      deepseek3.mla_moe_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                  architecture=HF_ARCHITECTURE),
      topk_method="group_limited_greedy" if grouped else "greedy",
      scoring_func="softmax")
