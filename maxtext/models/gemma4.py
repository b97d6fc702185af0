"""Gemma 4 (text decoder): what differs from the generic decoder.

Architecture (`ARCHITECTURE` below; sizes in `configs/gemma4.py`): Gemma 3's
block (embeddings scaled by sqrt(embed_dim), q/k norms, pre- and post-norms
around attention and MLP, GELU-tanh gates, local sliding-window layers
between global ones), but
- RMSNorms multiply by their weight (not `1 + weight`), and the values get a
  weightless RMS norm (`attention_value_norm`);
- attention logits are not scaled (`query_pre_attn_scalar` 1);
- global layers have heads of their own width (`global_head_dim`, 512 in
  every release) and, with attention_k_eq_v (31b, 26b-a4b), no value
  projection: their values are the key projection's output, with their
  own kv head count (`global_num_kv_heads`); they rotate only a quarter of
  their dimension pairs ("proportional" rotary: `rope_global_fraction`),
  base 1M; local layers use plain rotary with base 10k;
- each layer multiplies its output, the whole residual stream, by a scalar
  of its own (`layer_scalar`); the logits are soft-capped;
- 26b-a4b (enable_moe_block): every layer runs a mixture of experts next to
  its dense MLP (`moe_with_mlp`), each between norms of its own, the
  outputs added before the MLP's post-norm. The router reads the residual
  stream through a weightless norm, a learned scale and embed^-0.5
  (`router_input_norm`), picks the top-k of a softmax, renormalises and
  multiplies each chosen weight by its expert's learned scale
  (`router_per_expert_scale`). The checkpoints store the experts fused,
  `experts.gate_up_proj` [E, 2F, D] (gate, then up) and
  `experts.down_proj` [E, D, F];
- e2b and e4b: every layer gets an input of its own from a second token
  embedding and a projection of the first (`per_layer_input_dim`,
  `maxtext.models.decoder`), which it gates into the stream after its MLP;
  the last `kv_shared_layers` layers have no key and value projections and
  attend over those of the last earlier layer of their type (local or
  global), whose cache they read when decoding; e2b's MLP is twice as wide
  on those layers (`mlp_kv_shared_dim`, use_double_wide_mlp). The released
  checkpoints still hold k/v projections and norms for those layers, which
  transformers ignores; so does the loader (`hf_skipped_weights`).

This module maps Hugging Face's `Gemma4TextConfig` / `Gemma4ForCausalLM`
checkpoints onto that model; the multimodal `Gemma4ForConditionalGeneration`
releases load their text decoder (`registry.hf_text_config`).
"""

from collections.abc import Mapping
from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_params

MODEL_CLASS = decoder.Decoder

HF_PARAMS = hf_params.COMMON_PARAMS + (
    # Per-layer inputs (e2b, e4b).
    hf_params.ParamMap(("per_layer_embedder", "embedding"),
                       "model.embed_tokens_per_layer.weight"),
    hf_params.ParamMap(("per_layer_projection", "kernel"),
                       "model.per_layer_model_projection.weight", in_ndim=1),
    hf_params.ParamMap(("per_layer_norm", "scale"),
                       "model.per_layer_projection_norm.weight"),
)
HF_BLOCK_PARAMS = (
    hf_params.COMMON_BLOCK_PARAMS + hf_params.QK_NORMS +
    hf_params.SANDWICH_NORMS + (
        hf_params.block_param(("scalar",), "layer_scalar"),
        # The MoE block (26b-a4b).
        hf_params.ParamMap(("moe", "router", "kernel"),
                           "model.layers.{layer}.router.proj.weight",
                           in_ndim=1),
        hf_params.block_param(("moe", "router_scale"), "router.scale"),
        hf_params.block_param(("moe", "expert_scale"),
                              "router.per_expert_scale"),
        hf_params.block_param(("moe", "gate_up"), "experts.gate_up_proj",
                              halves=True, swapped=True),
        hf_params.block_param(("moe", "down"), "experts.down_proj",
                              swapped=True),
        hf_params.block_param(("pre_moe_norm", "scale"),
                              "pre_feedforward_layernorm_2.weight"),
        hf_params.block_param(("post_dense_norm", "scale"),
                              "post_feedforward_layernorm_1.weight"),
        hf_params.block_param(("post_moe_norm", "scale"),
                              "post_feedforward_layernorm_2.weight"),
        # Per-layer inputs (e2b, e4b).
        hf_params.ParamMap(("per_layer_gate", "kernel"),
                           "model.layers.{layer}.per_layer_input_gate.weight",
                           in_ndim=1),
        hf_params.ParamMap(("per_layer_projection", "kernel"),
                           "model.layers.{layer}.per_layer_projection.weight",
                           in_ndim=1),
        hf_params.block_param(("post_per_layer_norm", "scale"),
                              "post_per_layer_input_norm.weight")))

HF_MODEL_TYPE = "gemma4_text"
HF_ARCHITECTURE = "Gemma4ForCausalLM"

# The model fields this family fixes, whatever a checkpoint's config says:
# the one statement of its architecture (configs/gemma4.py holds sizes).
ARCHITECTURE = {"post_norms": True, "qk_norm": True, "scale_embeddings": True,
                "attention_value_norm": True, "query_pre_attn_scalar": 1.0,
                "layer_scalar": True, "mlp_activation": "gelu_tanh"}
# What the MoE block (enable_moe_block) fixes; its sizes come from the config.
MOE_ARCHITECTURE = {"moe_with_mlp": True, "router_input_norm": True,
                    "router_per_expert_scale": True,
                    "expert_gate_up_fused": True, "router_score": "softmax",
                    "router_normalize": True}

_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")
# Sizes that `Gemma4TextConfig` defaults when a config.json leaves them out
# (a multimodal release's `text_config` stores only what differs).
_HF_DEFAULTS = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 30, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "sliding_window": 512,
    "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262_144,
    "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
}
_DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional",
                       "partial_rotary_factor": 0.25,
                       "rope_theta": 1_000_000.0},
}


def _unsupported(hf: Mapping[str, Any]) -> None:
  """ValueError naming the first setting this model does not implement."""
  if hf.get("attention_bias"):
    raise ValueError(f"Gemma 4 attention_bias={hf['attention_bias']!r}: "
                     "attention biases are not supported; supported: False.")
  if (hf["hidden_size_per_layer_input"] and
      hf["vocab_size_per_layer_input"] != hf["vocab_size"]):
    raise ValueError(
        f"Gemma 4 vocab_size_per_layer_input="
        f"{hf['vocab_size_per_layer_input']!r}: per-layer embeddings of "
        f"another vocabulary than vocab_size={hf['vocab_size']} are not "
        "supported.")
  if hf.get("use_bidirectional_attention") == "all":
    raise ValueError("Gemma 4 use_bidirectional_attention='all' (an encoder)"
                     " is not supported; supported: None or 'vision'.")
  if hf["hidden_activation"] not in _ACTIVATIONS:
    raise ValueError(f"Unsupported Gemma 4 hidden_activation "
                     f"{hf['hidden_activation']!r}; supported: "
                     f"{list(_ACTIVATIONS)}.")


def _rope_fields(rope: Mapping[str, Any], *, same_heads: bool
                 ) -> dict[str, Any]:
  """Our rotary fields of Gemma 4's per-layer-type `rope_parameters`."""
  local = rope["sliding_attention"]
  if local.get("rope_type", "default") != "default":
    raise ValueError(f"Gemma 4 sliding_attention rope_type "
                     f"{local['rope_type']!r}: supported: 'default'.")
  full = dict(rope["full_attention"])
  fields = {"rope_local_theta": float(local["rope_theta"])}
  if full.get("rope_type") != "proportional":
    if not same_heads:
      raise ValueError(
          f"Gemma 4 full_attention rope_type {full.get('rope_type')!r} with "
          "global_head_dim != head_dim: transformers rotates a global head "
          "by head_dim's frequencies; supported: 'proportional'.")
    return {**fields, **hf_params.rope_fields(full)}
  factor = float(full.get("factor", 1.0))
  return dict(fields, rope_theta=float(full["rope_theta"]),
              rope_scaling="default" if factor == 1.0 else "linear",
              rope_scaling_factor=factor,
              rope_global_fraction=float(
                  full.get("partial_rotary_factor", 1.0)))


def model_config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
  """`ModelConfig` of a Hugging Face Gemma 4 text config.

  Args:
    hf_config: `Gemma4TextConfig.to_dict()`, or a text-decoder `config.json`
      (keys it lacks take `Gemma4TextConfig`'s defaults). Its layer_types
      give the local/global pattern (one global layer every N; transformers
      forces the last layer global); num_global_key_value_heads counts
      with attention_k_eq_v only, as in transformers.

  Raises:
    ValueError: a setting this model does not implement (`_unsupported`),
      layer_types that are not one global layer every N, or a rotary type
      other than Gemma 4's.
  """
  hf = {**_HF_DEFAULTS, **hf_config}
  _unsupported(hf)
  layer_types = list(hf.get("layer_types") or [
      "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
      for i in range(hf["num_hidden_layers"])])
  layer_types[-1] = "full_attention"  # As transformers forces it.
  interval = hf_params.global_layer_interval(layer_types)
  head_dim, kv_heads = hf["head_dim"], hf["num_key_value_heads"]
  k_eq_v = bool(hf.get("attention_k_eq_v"))
  global_head_dim = hf["global_head_dim"] or head_dim
  global_kv_heads = ((k_eq_v and hf.get("num_global_key_value_heads"))
                     or kv_heads)
  if interval == 1:  # Every layer global: one set of sizes.
    sizes = dict(head_dim=global_head_dim, num_kv_heads=global_kv_heads,
                 attention_k_eq_v=k_eq_v)
  else:  # 0 where a global size equals the local one.
    sizes = dict(head_dim=head_dim, num_kv_heads=kv_heads,
                 global_head_dim=(global_head_dim
                                  if global_head_dim != head_dim else 0),
                 global_num_kv_heads=(global_kv_heads
                                      if global_kv_heads != kv_heads else 0),
                 attention_global_k_eq_v=k_eq_v)
  return ModelConfig.from_dict(dict(
      family="gemma4",
      **ARCHITECTURE,
      vocab_size=hf["vocab_size"],
      num_layers=hf["num_hidden_layers"],
      embed_dim=hf["hidden_size"],
      mlp_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"],
      **sizes,
      tie_embeddings=hf["tie_word_embeddings"],
      norm_eps=hf["rms_norm_eps"],
      sliding_window=hf["sliding_window"] if interval != 1 else 0,
      global_layer_interval=interval,
      final_logit_softcap=hf.get("final_logit_softcapping") or 0.0,
      per_layer_input_dim=hf["hidden_size_per_layer_input"] or 0,
      kv_shared_layers=hf["num_kv_shared_layers"] or 0,
      mlp_kv_shared_dim=(2 * hf["intermediate_size"]
                         if hf["use_double_wide_mlp"] and
                         hf["num_kv_shared_layers"] else 0),
      **_rope_fields(hf.get("rope_parameters") or _DEFAULT_ROPE,
                     same_heads=global_head_dim == head_dim),
      **_moe_fields(hf),
  ))


def hf_skipped_weights(cfg: ModelConfig) -> frozenset[str]:
  """Names of weights a checkpoint may hold that the model does not use:
  the key and value projections and norms of the layers that share keys
  and values (the released e2b and e4b keep them; transformers ignores
  them too)."""
  first = cfg.num_layers - cfg.pattern.kv_shared_layers
  return frozenset(
      f"model.layers.{layer}.self_attn.{name}.weight"
      for layer in range(first, cfg.num_layers)
      for name in ("k_proj", "v_proj", "k_norm", "v_norm"))


def _moe_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """Our MoE fields of a config with enable_moe_block (else none)."""
  if not hf.get("enable_moe_block"):
    return {}
  for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
    if not hf.get(key):
      raise ValueError(f"Gemma 4 {key}={hf.get(key)!r} with enable_moe_block:"
                       " the MoE block needs a positive value.")
  return dict(MOE_ARCHITECTURE, num_experts=hf["num_experts"],
              num_experts_per_token=hf["top_k_experts"],
              moe_mlp_dim=hf["moe_intermediate_size"])


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """Hugging Face `config.json` of `cfg` (inverse of `model_config_from_hf`).

  Every key whose `Gemma4TextConfig` default would change the model is
  written (per-layer inputs, KV sharing, the double-wide MLP).

  Raises:
    ValueError: the last layer is local (transformers makes it global),
      global rotary scaling other than "default"/"linear" on a fraction of
      the pairs, experts that are not Gemma 4's MoE block in every layer,
      or a KV-shared layers' MLP width other than mlp_dim or twice it.
  """
  if cfg.layer_windows()[-1] is not None:
    raise ValueError(
        f"Gemma 4's last layer is global in transformers, but layer "
        f"{cfg.num_layers - 1} is local (global_layer_interval="
        f"{cfg.pattern.global_layer_interval} with num_layers="
        f"{cfg.num_layers}); make num_layers a multiple of the interval.")
  moe = _hf_moe(cfg)
  wide = cfg.mlp.kv_shared_dim
  if wide not in (0, 2 * cfg.mlp.dim):
    raise ValueError(
        f"Gemma 4 exports mlp_kv_shared_dim={wide}: transformers' KV-shared "
        f"layers have an MLP of mlp_dim={cfg.mlp.dim} or twice that "
        "(use_double_wide_mlp); use 0 or "
        f"{2 * cfg.mlp.dim}.")
  config = hf_params.decoder_hf_config(cfg, model_type=HF_MODEL_TYPE,
                                       architecture=HF_ARCHITECTURE)
  attention = cfg.attention
  everywhere = cfg.pattern.global_layer_interval == 1
  global_attention = (attention.global_sizes()
                      if attention.global_sizes_key() else attention)
  full = {"rope_type": "proportional", "rope_theta": cfg.rope.theta,
          "partial_rotary_factor": cfg.rope.global_fraction}
  if cfg.rope.scaling == "linear":
    full["factor"] = cfg.rope.scaling_factor
  elif cfg.rope.scaling != "default":
    if cfg.rope.global_fraction != 1.0:
      raise ValueError(
          f"Gemma 4 exports rope_global_fraction={cfg.rope.global_fraction} "
          "with rope_scaling 'default' or 'linear' only, not "
          f"{cfg.rope.scaling!r}.")
    full = config["rope_parameters"]
  config["rope_parameters"] = {
      "full_attention": full,
      "sliding_attention": {"rope_type": "default",
                            "rope_theta": cfg.rope.local_theta},
  }
  return dict(
      config,
      hidden_activation="gelu_pytorch_tanh",
      global_head_dim=global_attention.head_dim,
      num_global_key_value_heads=global_attention.num_kv_heads,
      attention_k_eq_v=global_attention.k_eq_v,
      # Without a global layer attention_k_eq_v has nothing to change.
      num_key_value_heads=(global_attention.num_kv_heads if everywhere
                           else attention.num_kv_heads),
      sliding_window=cfg.pattern.sliding_window or 512,
      layer_types=hf_params.hf_layer_types(cfg),
      final_logit_softcapping=cfg.final_logit_softcap or None,
      hidden_size_per_layer_input=cfg.per_layer_input_dim,
      vocab_size_per_layer_input=cfg.vocab_size,
      num_kv_shared_layers=cfg.pattern.kv_shared_layers,
      use_double_wide_mlp=bool(wide), attention_bias=False, **moe)


def _hf_moe(cfg: ModelConfig) -> dict[str, Any]:
  """The MoE keys of `cfg`'s `config.json`; ValueError naming the first
  setting that transformers' Gemma 4 MoE block does not have."""
  if not cfg.moe.num_experts:
    return {"enable_moe_block": False}
  fields = {"first_dense_layers": cfg.pattern.first_dense_layers,
            "moe_layer_interval": cfg.pattern.moe_layer_interval,
            **{key: getattr(cfg.moe, name)
               for name, key in cfg.moe.KEYS.items()}}
  expected = dict(MOE_ARCHITECTURE, first_dense_layers=0,
                  moe_layer_interval=1, num_shared_experts=0,
                  router_bias=False, router_logit_bias=False,
                  expert_bias=False, routed_scaling_factor=1.0,
                  router_weights_on_input=False, num_expert_groups=1)
  for key, value in expected.items():
    if fields[key] != value:
      raise ValueError(f"Gemma 4 exports {key}={fields[key]!r}: its MoE block"
                       f" has {key}={value!r}.")
  return dict(enable_moe_block=True, num_experts=cfg.moe.num_experts,
              top_k_experts=cfg.moe.num_experts_per_token,
              moe_intermediate_size=cfg.moe.mlp_dim)
