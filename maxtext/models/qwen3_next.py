"""Qwen3-Next: what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/qwen3_next.py`): three
Gated DeltaNet layers (`maxtext.layers.gated_deltanet`) then one full
attention layer, repeated (`full_attention_interval` 4). The full attention
layers have q/k norms, a sigmoid output gate per head and dimension
(`attention_output_gate`) and rotate only the first quarter of each head
(`rope_partial_factor`); every RMS norm but the Gated DeltaNet's output norm
is zero-centred (`norm_offset` 1). Every layer has a mixture of experts
(softmax router, top-k renormalised) plus one shared expert whose output a
sigmoid gate scales (`shared_expert_gate`).

This module maps Hugging Face's `Qwen3NextConfig` / `Qwen3NextForCausalLM`
checkpoints onto that model, and holds what Qwen3.5 (`qwen3_5`,
`qwen3_5_moe`) shares with it. Qwen3-Next fuses a Gated DeltaNet layer's
input projections into `in_proj_qkvz` and `in_proj_ba`, grouped by key head
(each group: its query, key, values and output gates; its betas and decays),
and its attention's query and gate into `q_proj` (per head: query, then
gate): our separate parameters are row slices of those (`ParamMap.rows`).
The checkpoints' multi-token prediction module (`mtp.*`) is skipped, as
transformers skips it.
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_MODEL_TYPE = "qwen3_next"
HF_ARCHITECTURE = "Qwen3NextForCausalLM"
HF_SKIPPED_PREFIXES = ("mtp.",)

ARCHITECTURE = {"qk_norm": True, "mlp_activation": "silu", "norm_offset": 1.0,
                "attention_output_gate": True}


def _block(path, hf_suffix, in_ndim=0, rows=None, conv1d=False):
  return hf_params.block_param(path, hf_suffix, in_ndim=in_ndim, rows=rows,
                               conv1d=conv1d)


def gated_attention_params(heads: int, head_dim: int):
  """The full attention layers' entries: q_proj holds each head's query,
  then its output gate; q/k norms."""
  return (
      hf_params.COMMON_BLOCK_PARAMS[0],  # input_layernorm
      _block(("attention", "query", "kernel"), "self_attn.q_proj.weight", 1,
             (heads, 0, head_dim)),
      _block(("attention", "gate", "kernel"), "self_attn.q_proj.weight", 1,
             (heads, head_dim, 2 * head_dim)),
      *hf_params.COMMON_BLOCK_PARAMS[2:4],  # k_proj, v_proj
      hf_params.COMMON_BLOCK_PARAMS[4],  # o_proj
      hf_params.PRE_MLP_NORM,
      *hf_params.QK_NORMS,
  )


def deltanet_params(convs) -> tuple[hf_params.ParamMap, ...]:
  """A Gated DeltaNet layer's entries besides its input projections:
  `convs` the row slices of `conv1d.weight` [channels, 1, taps] holding
  the query, key and value channels."""
  prefix = "linear_attn."
  return tuple(
      _block(("linear_attention", name + "_conv"), prefix + "conv1d.weight",
             rows=(1, *span), conv1d=True) for name, span in zip(("query", "key", "value"),
                                                    convs)) + (
      _block(("linear_attention", "decay_bias"), prefix + "dt_bias"),
      _block(("linear_attention", "log_rate"), prefix + "A_log"),
      _block(("linear_attention", "norm", "scale"), prefix + "norm.weight"),
      _block(("linear_attention", "output", "kernel"), prefix + "out_proj.weight", 2),
  )


def conv_spans(cfg: ModelConfig) -> tuple[tuple[int, int], ...]:
  """Rows of the query, key and value channels in `conv1d.weight`."""
  linear = cfg.linear_attention
  keys = linear.num_key_heads * linear.key_head_dim
  values = linear.num_value_heads * linear.value_head_dim
  return (0, keys), (keys, 2 * keys), (2 * keys, 2 * keys + values)


def _grouped_projections(cfg: ModelConfig) -> tuple[hf_params.ParamMap, ...]:
  """Qwen3-Next's in_proj_qkvz and in_proj_ba, grouped by key head."""
  linear = cfg.linear_attention
  groups = linear.num_key_heads
  ratio = linear.num_value_heads // groups
  key, value = linear.key_head_dim, ratio * linear.value_head_dim
  qkvz = "linear_attn.in_proj_qkvz.weight"
  ba = "linear_attn.in_proj_ba.weight"
  return (
      _block(("linear_attention", "query", "kernel"), qkvz, 1, (groups, 0, key)),
      _block(("linear_attention", "key", "kernel"), qkvz, 1, (groups, key, 2 * key)),
      _block(("linear_attention", "value", "kernel"), qkvz, 1,
             (groups, 2 * key, 2 * key + value)),
      _block(("linear_attention", "gate", "kernel"), qkvz, 1,
             (groups, 2 * key + value, 2 * key + 2 * value)),
      _block(("linear_attention", "beta", "kernel"), ba, 1, (groups, 0, ratio)),
      _block(("linear_attention", "decay", "kernel"), ba, 1,
             (groups, ratio, 2 * ratio)),
  )


SHARED_EXPERT_PARAMS = tuple(
    _block(("moe", "shared", name, "kernel"),
           f"mlp.shared_expert.{name}_proj.weight", 1)
    for name in ("gate", "up", "down")) + (
        _block(("moe", "shared", "output_gate", "kernel"),
               "mlp.shared_expert_gate.weight", 1),)
EXPERT_PARAMS = hf_params.expert_params("mlp", "gate", gate="gate_proj",
                                        up="up_proj", down="down_proj")

HF_PARAMS = hf_params.COMMON_PARAMS


def hf_block_params(cfg: ModelConfig) -> tuple[hf_params.ParamMap, ...]:
  """Per-layer entries of `cfg`'s sizes."""
  return (gated_attention_params(cfg.attention.num_heads,
                                 cfg.attention.head_dim) +
          _grouped_projections(cfg) + deltanet_params(conv_spans(cfg)) +
          EXPERT_PARAMS + SHARED_EXPERT_PARAMS)


def linear_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """`ModelConfig` fields of the Gated DeltaNet layers, the layer pattern
  and the partial rotary of a Qwen3-Next or Qwen3.5 config.

  Raises:
    ValueError: `layer_types` other than one full attention layer every N,
      attention_bias, or an activation other than silu.
  """
  for unsupported in ("attention_bias",):
    if hf.get(unsupported):
      raise ValueError(f"{hf['model_type']} {unsupported}="
                       f"{hf[unsupported]!r} is not supported.")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"Unsupported {hf['model_type']} hidden_act "
                     f"{hf['hidden_act']!r}; supported: 'silu'.")
  layer_types = list(hf["layer_types"])
  interval = (layer_types.index("full_attention") + 1
              if "full_attention" in layer_types else 0)
  expected = ["full_attention" if interval and (i + 1) % interval == 0
              else "linear_attention" for i in range(len(layer_types))]
  if layer_types != expected:
    raise ValueError(f"layer_types {layer_types} are not one full attention"
                     " layer every N layers, the others linear attention.")
  rope = hf_params.rope_dict(hf)
  return dict(
      linear_num_key_heads=hf["linear_num_key_heads"],
      linear_num_value_heads=hf["linear_num_value_heads"],
      linear_key_head_dim=hf["linear_key_head_dim"],
      linear_value_head_dim=hf["linear_value_head_dim"],
      linear_conv_taps=hf["linear_conv_kernel_dim"],
      full_attention_interval=interval,
      rope_partial_factor=float(rope.get(
          "partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))),
  )


def linear_hf_config(cfg: ModelConfig, *, model_type: str,
                     architecture: str) -> dict[str, Any]:
  """`config.json` keys of `linear_fields` and the decoder's sizes (their
  inverse)."""
  config = hf_params.decoder_hf_config(cfg, model_type=model_type,
                                       architecture=architecture)
  config["rope_parameters"]["partial_rotary_factor"] = cfg.rope.partial_factor
  linear = cfg.linear_attention
  return dict(
      config, hidden_act="silu", attention_bias=False,
      linear_num_key_heads=linear.num_key_heads,
      linear_num_value_heads=linear.num_value_heads,
      linear_key_head_dim=linear.key_head_dim,
      linear_value_head_dim=linear.value_head_dim,
      linear_conv_kernel_dim=linear.conv_taps,
      layer_types=["linear_attention" if linear_layer else "full_attention"
                   for linear_layer in linear.linear_layers(cfg.num_layers)])


def moe_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """`ModelConfig` fields of the experts and the gated shared expert."""
  if hf.get("decoder_sparse_step", 1) != 1 or hf.get("mlp_only_layers"):
    raise ValueError(f"{hf['model_type']} dense layers among the experts "
                     "(decoder_sparse_step != 1 or mlp_only_layers) are not "
                     "supported.")
  return dict(
      num_experts=hf["num_experts"],
      num_experts_per_token=hf["num_experts_per_tok"],
      moe_mlp_dim=hf["moe_intermediate_size"],
      router_normalize=bool(hf.get("norm_topk_prob", True)),
      num_shared_experts=1,
      shared_expert_mlp_dim=hf["shared_expert_intermediate_size"],
      shared_expert_gate=True,
      load_balance_loss_weight=hf.get("router_aux_loss_coef", 0.0))


def moe_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """`config.json` keys of `moe_fields` (its inverse)."""
  return dict(num_experts=cfg.moe.num_experts,
              num_experts_per_tok=cfg.moe.num_experts_per_token,
              moe_intermediate_size=cfg.moe.mlp_dim,
              shared_expert_intermediate_size=cfg.moe.shared_mlp_dim,
              norm_topk_prob=cfg.moe.router_normalize,
              router_aux_loss_coef=cfg.moe.load_balance_loss_weight)


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Qwen3-Next config
  (`Qwen3NextConfig.to_dict()` or its `config.json`).

  Raises:
    ValueError: as `linear_fields` and `moe_fields`.
  """
  hf = hf_config
  return ModelConfig.from_dict(dict(
      family="qwen3_next", **ARCHITECTURE, **linear_fields(hf),
      **moe_fields(hf),
      **hf_params.decoder_fields(hf, tie_embeddings_default=False)))


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`)."""
  return dict(linear_hf_config(cfg, model_type=HF_MODEL_TYPE,
                               architecture=HF_ARCHITECTURE),
              decoder_sparse_step=1, mlp_only_layers=[], **moe_hf_config(cfg))
