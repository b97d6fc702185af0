"""DeepSeek-V3.2: DeepSeek-V3 with DeepSeek Sparse Attention.

The blocks of DeepSeek-V3 (`deepseek3`: multi-head latent attention with
interleaved rotary and YaRN, dense then sigmoid-routed experts, multi-token
prediction), whose attention has a lightning indexer that picks the
`index_topk` tokens each query attends to (`maxtext.layers.mla`,
`maxtext.kernels.sparse_attention`). Hugging Face's `DeepseekV32Config` /
`DeepseekV32ForCausalLM` (model_type "deepseek_v32") are the reference;
checkpoints use DeepSeek-V3's names plus `self_attn.indexer.*`: wq_b (from
the query latent), wk, k_norm (a LayerNorm with bias) and weights_proj.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import deepseek3
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = deepseek3.HF_PARAMS
_INDEXER_PARAMS = tuple(
    hf_params.ParamMap(("attention",) + path,
                       "model.layers.{layer}.self_attn.indexer." + name,
                       in_ndim=in_ndim)
    for path, name, in_ndim in (
        (("index_query", "kernel"), "wq_b.weight", 1),
        (("index_key", "kernel"), "wk.weight", 1),
        (("index_key_norm", "scale"), "k_norm.weight", 0),
        (("index_key_norm", "bias"), "k_norm.bias", 0),
        (("index_weights", "kernel"), "weights_proj.weight", 1),
    ))
HF_BLOCK_PARAMS = deepseek3.HF_BLOCK_PARAMS + _INDEXER_PARAMS
HF_MTP_PARAMS = deepseek3.HF_MTP_PARAMS + tuple(
    hf_params.ParamMap(("block",) + e.path, e.hf_name, e.in_ndim, e.flatten)
    for e in _INDEXER_PARAMS)
HF_MTP_COPIES = deepseek3.HF_MTP_COPIES

HF_MODEL_TYPE = "deepseek_v32"
HF_ARCHITECTURE = "DeepseekV32ForCausalLM"

ARCHITECTURE = deepseek3.ARCHITECTURE


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face DeepSeek-V3.2 config
  (`DeepseekV32Config.to_dict()` or DeepSeek-V3.2's `config.json`).

  Raises:
    ValueError: as `deepseek3.model_config_from_hf`, or no q_lora_rank
      (the indexer reads the query latent).
  """
  fields = deepseek3.model_config_from_hf(hf_config).to_dict()
  fields.update(family="deepseek3_2", **ARCHITECTURE,
                index_topk=hf_config["index_topk"],
                index_num_heads=hf_config["index_n_heads"],
                index_head_dim=hf_config["index_head_dim"])
  return ModelConfig.from_dict(fields)


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  config = deepseek3.hf_config_from_model_config(cfg)
  config.update(model_type=HF_MODEL_TYPE, architectures=[HF_ARCHITECTURE],
                num_experts=cfg.moe.num_experts,
                index_topk=cfg.mla.index_topk,
                index_n_heads=cfg.mla.index_num_heads,
                index_head_dim=cfg.mla.index_head_dim)
  return config
