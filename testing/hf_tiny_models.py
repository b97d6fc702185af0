"""Test helper: tiny random Hugging Face models of every family.

Float32 `transformers` models built from config objects, with sliding
windows of 5 tokens where the family has one, so short generations already
leave the window.
Test-only (imports torch and transformers).
"""

import torch
import transformers

from testing import hf_reference

SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96,
             num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
# Gated DeltaNet then full attention (Qwen3-Next, Qwen3.5).
_LINEAR = dict(head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_value_head_dim=8,
               layer_types=["linear_attention", "full_attention"])
# MLA with low-rank queries and interleaved YaRN rotary; the first layer
# dense, then 8 sigmoid-routed experts in 4 groups + one shared.
_DEEPSEEK3 = dict(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24,
                  kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
                  v_head_dim=10, moe_intermediate_size=32,
                  n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                  topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
                  routed_scaling_factor=2.5, rope_parameters=dict(
                      rope_type="yarn", rope_theta=10_000.0, factor=4.0,
                      original_max_position_embeddings=16, beta_fast=32.0,
                      beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))
# family -> (config class, model class, config changes, norm mean).
FAMILIES = {
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
               dict(head_dim=16, rope_scaling=dict(
                   rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=8)),
               1.0),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(head_dim=16, sliding_window=5), 1.0),
    "deepseek3": (transformers.DeepseekV3Config,
                  transformers.DeepseekV3ForCausalLM, _DEEPSEEK3, 1.0),
    # The same with DeepSeek Sparse Attention: each query attends to the 4
    # tokens its indexer scores highest (16 heads: no two scores tie, where
    # torch's and our top-k could pick differently).
    "deepseek3_2": (transformers.DeepseekV32Config,
                    transformers.DeepseekV32ForCausalLM,
                    dict(_DEEPSEEK3, num_experts=8, index_topk=4,
                         index_n_heads=16, index_head_dim=16), 1.0),
    # MLA without low-rank queries, interleaved YaRN rotary (mscale_all_dim
    # 0: transformers 5.12 leaves its softmax factor out); the first layer
    # dense, then 8 softmax-routed experts in 4 groups scored by their best
    # expert (group-limited greedy) + two shared.
    "deepseek2": (transformers.DeepseekV2Config,
                  transformers.DeepseekV2ForCausalLM,
                  dict(num_hidden_layers=3, num_key_value_heads=4,
                       q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                       qk_nope_head_dim=12, v_head_dim=10,
                       moe_intermediate_size=32, n_routed_experts=8,
                       num_experts_per_tok=3, n_group=4, topk_group=2,
                       topk_method="group_limited_greedy",
                       n_shared_experts=2, first_k_dense_replace=1,
                       routed_scaling_factor=2.5, norm_topk_prob=False,
                       rope_parameters=dict(
                           rope_type="yarn", rope_theta=10_000.0,
                           factor=4.0, original_max_position_embeddings=16,
                           beta_fast=32.0, beta_slow=1.0, mscale=0.707,
                           mscale_all_dim=0.0)),
                  1.0),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM,
              dict(num_key_value_heads=1, head_dim=24), 0.0),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
               dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=5,
                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                    attn_implementation="eager"), 0.0),
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               dict(num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24,
                    sliding_window=5, layer_types=[
                        "sliding_attention", "sliding_attention",
                        "full_attention"],
                    rope_scaling=dict(rope_type="linear", factor=8.0)), 0.0),
    # Two local layers (window 5) then a global one whose heads are twice
    # as wide, with one kv head and values equal to keys, rotating a quarter
    # of its pairs; soft-capped logits.
    "gemma4": (transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM,
               dict(num_hidden_layers=3, head_dim=16, global_head_dim=32,
                    num_global_key_value_heads=1, attention_k_eq_v=True,
                    sliding_window=5, hidden_size_per_layer_input=0,
                    final_logit_softcapping=3.0, attn_implementation="eager",
                    layer_types=["sliding_attention", "sliding_attention",
                                 "full_attention"]), 1.0),
    "qwen2_5": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                dict(tie_word_embeddings=True), 1.0),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(head_dim=24), 1.0),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2),
                1.0),
    # Yarn over a short original context, so it matters in short sequences.
    "gpt_oss": (transformers.GptOssConfig, transformers.GptOssForCausalLM,
                dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=5, rope_parameters=dict(
                         rope_type="yarn", rope_theta=150_000.0, factor=4.0,
                         beta_fast=32.0, beta_slow=1.0, truncate=False,
                         original_max_position_embeddings=16)), 1.0),
    # Post-norms only, q/k norms over the projection; 3 sliding layers then
    # a global one.
    "olmo3": (transformers.Olmo3Config, transformers.Olmo3ForCausalLM,
              dict(num_hidden_layers=4, sliding_window=5,
                   rope_parameters=dict(rope_type="default",
                                        rope_theta=10_000.0)), 1.0),
    # Three chunked layers (chunks of 4) then a NoPE one with temperature
    # tuning from position 3 on; dense and expert layers alternating, top-2
    # of 4 experts on their inputs plus a shared one; interleaved Llama 3
    # rotary over a short original context.
    "llama4": (transformers.Llama4TextConfig, transformers.Llama4ForCausalLM,
               dict(num_hidden_layers=4, head_dim=16, intermediate_size=32,
                    intermediate_size_mlp=96, num_local_experts=4,
                    num_experts_per_tok=2, interleave_moe_layer_step=2,
                    attention_chunk_size=4, floor_scale=4, attn_scale=0.5,
                    attn_implementation="eager", rope_parameters=dict(
                        rope_type="llama3", rope_theta=10_000.0, factor=8.0,
                        low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=8)), 1.0),
    "qwen3_moe": (transformers.Qwen3MoeConfig,
                  transformers.Qwen3MoeForCausalLM,
                  dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, norm_topk_prob=True), 1.0),
    # A Gated DeltaNet layer (2 key heads, 4 value heads) then a gated full
    # attention layer rotating a quarter of its heads; 4 experts, top 2,
    # and a gated shared expert.
    "qwen3_next": (transformers.Qwen3NextConfig,
                   transformers.Qwen3NextForCausalLM,
                   dict(_LINEAR, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32,
                        shared_expert_intermediate_size=48), 0.0),
    # The same layers with a dense MLP; fused q, k, v projections.
    "qwen3_5": (transformers.Qwen3_5TextConfig,
                transformers.Qwen3_5ForCausalLM, dict(_LINEAR), 0.0),
}


def with_fixes(model: torch.nn.Module) -> torch.nn.Module:
  """`model` (built or loaded) with the locked transformers' known bugs
  worked around: 5.12's DeepseekV2Moe reads `self.num_experts` in its
  group-limited routing but never sets it (later versions read the
  config's n_routed_experts), so it is set to that."""
  for module in model.modules():
    if (type(module).__name__ == "DeepseekV2Moe"
        and not hasattr(module, "num_experts")):
      module.num_experts = model.config.n_routed_experts
  return model


def tiny_hf_model(family: str, seed: int = 0,
                  **config_changes) -> torch.nn.Module:
  """A float32 eval-mode model of `family` (its `FAMILIES` config, then
  `config_changes`) with random weights; generation never stops at an EOS
  token (none is set)."""
  config_class, model_class, changes, norm_mean = FAMILIES[family]
  model = with_fixes(hf_reference.random_hf_model(
      model_class, config_class(**{**SIZES, **changes, **config_changes}),
      norm_mean=norm_mean, seed=seed))
  with torch.no_grad():  # Gemma 4's per-layer scalars: checkpoint buffers.
    for module in model.modules():
      if isinstance(getattr(module, "layer_scalar", None), torch.Tensor):
        module.layer_scalar.uniform_(0.5, 1.5)
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model


def hf_greedy(model: torch.nn.Module, prompt: list[int],
              max_new_tokens: int) -> list[int]:
  """transformers' `generate(do_sample=False)`: the new tokens only."""
  with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), do_sample=False,
                         max_new_tokens=max_new_tokens)
  return out[0, len(prompt):].tolist()


# A tiny Gemma 3 vision-language model: 2 SigLIP layers over 28 x 28
# images in 7-pixel patches, 4 soft tokens per image (the 4 x 4 patch grid
# pooled 2 x 2); a sliding window (3) shorter than an image's tokens, so
# the images' bidirectional blocks reach past it; 6 layers (5 local + 1
# global); the image placeholder id outside the vocabulary, as transformers
# allows.
GEMMA3_VLM_IDS = dict(image_token_index=99, boi_token_index=93,
                      eoi_token_index=94)


def tiny_gemma3_vlm(seed: int = 0, *, vocab_size: int = 96,
                    ids: dict[str, int] | None = None
                    ) -> transformers.Gemma3ForConditionalGeneration:
  """The tiny Gemma 3 vision-language model with random parameters (of
  `vocab_size` text ids, its image ids `ids`, default `GEMMA3_VLM_IDS`)."""
  config = transformers.Gemma3Config(
      text_config=dict(
          vocab_size=vocab_size, hidden_size=64, intermediate_size=96,
          num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
          head_dim=16, sliding_window=3, max_position_embeddings=128,
          rope_theta=10_000.0, rope_local_base_freq=10_000.0),
      vision_config=dict(hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4,
                         image_size=28, patch_size=7, vision_use_head=False),
      mm_tokens_per_image=4, **(ids or GEMMA3_VLM_IDS))
  config.text_config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(seed)
  model = transformers.Gemma3ForConditionalGeneration(config).float().eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      # SigLIP's LayerNorms multiply by their weight, Gemma's RMSNorms by
      # 1 + weight.
      layer_norm = "layer_norm" in name or "layernorm" in name.split(".")[-2]
      mean = 1.0 if layer_norm and name.endswith("weight") else 0.0
      parameter.normal_(mean, 0.1)
  return model


# A tiny Llama 4 vision-language model: the tiny Llama 4 text model (chunks
# of 4) with a 2-layer tower over 28 x 28 tiles in 7-pixel patches (4 x 4
# patches, 8-wide heads for the 2-D rotary), pixel-shuffled 2 x 2 into 4
# soft tokens per tile; its image ids inside the vocabulary (transformers'
# Llama 4 embeds them before replacing them).
LLAMA4_VLM_IDS = dict(image_token_index=120, boi_token_index=121,
                      eoi_token_index=122)
# The prompt's other image tokens (ids of this tiny model).
LLAMA4_VLM_TEXT_IDS = {"<|image_start|>": 121, "<|image_end|>": 122,
                       "<|patch|>": 120, "<|tile_x_separator|>": 123,
                       "<|tile_y_separator|>": 124, "<|image|>": 125}


def tiny_llama4_vlm(seed: int = 0
                    ) -> transformers.Llama4ForConditionalGeneration:
  """The tiny Llama 4 vision-language model with random parameters (its
  image ids `LLAMA4_VLM_IDS`, 128 text ids)."""
  _, _, text, _ = FAMILIES["llama4"]
  config = transformers.Llama4Config(
      text_config={**SIZES, **text},
      vision_config=dict(hidden_size=32, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4,
                         image_size=28, patch_size=7, pixel_shuffle_ratio=0.5,
                         projector_input_dim=48, projector_output_dim=48,
                         vision_output_dim=48, rope_theta=10_000.0),
      attn_implementation="eager", **LLAMA4_VLM_IDS)
  torch.manual_seed(seed)
  model = transformers.Llama4ForConditionalGeneration(config).float().eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      # Every norm (LayerNorm, RMSNorm) multiplies by its weight.
      norm = parameter.ndim == 1 and name.endswith("norm.weight") or (
          "layernorm" in name and name.endswith("weight"))
      parameter.normal_(1.0 if norm else 0.0, 0.1)
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model
