"""Test helper: every family's config file, and tiny models built from them.

`tiny_model_config(family)` is the family's small config shrunk to a few
thousand parameters (the family's own choices such as norms, soft-caps and
the local/global pattern kept), for tests that run every family.
"""

from configs import deepseek2
from configs import deepseek3
from configs import deepseek3_2
from configs import gemma
from configs import gemma2
from configs import gemma3
from configs import gemma4
from configs import gpt_oss
from configs import llama2
from configs import llama3
from configs import llama4
from configs import mistral
from configs import mixtral
from configs import olmo3
from configs import qwen2_5
from configs import qwen3
from configs import qwen3_5
from configs import qwen3_5_moe
from configs import qwen3_moe
from configs import qwen3_next
from maxtext.common.model_config import ModelConfig

# family -> its config module (`configs/<family>.py`).
CONFIG_MODULES = {
    "deepseek2": deepseek2, "deepseek3": deepseek3,
    "deepseek3_2": deepseek3_2, "gemma": gemma, "gemma2": gemma2,
    "gemma3": gemma3, "gemma4": gemma4, "gpt_oss": gpt_oss,
    "llama2": llama2, "llama3": llama3, "llama4": llama4,
    "mistral": mistral, "mixtral": mixtral, "olmo3": olmo3,
    "qwen2_5": qwen2_5, "qwen3": qwen3, "qwen3_5": qwen3_5,
    "qwen3_5_moe": qwen3_5_moe, "qwen3_moe": qwen3_moe,
    "qwen3_next": qwen3_next,
}


def tiny_model_config(family: str, *, window: int,
                      **changes) -> ModelConfig:
  """`family`'s small config shrunk; a sliding window or attention chunk
  (if any) of `window`."""
  model = CONFIG_MODULES[family].get_config().model
  model.update(vocab_size=64, num_layers=3, embed_dim=32, mlp_dim=48,
               num_heads=4, num_kv_heads=2, head_dim=8)
  if model.num_experts:
    model.moe_mlp_dim = 16
  if model.global_head_dim:  # Global layers' heads still wider (Gemma 4).
    model.global_head_dim = 16
  if model.global_num_kv_heads:
    model.global_num_kv_heads = 1
  if model.linear_num_key_heads:  # Gated DeltaNet, full attention, DeltaNet.
    model.update(linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=8, linear_value_head_dim=8,
                 full_attention_interval=2)
  if model.shared_expert_mlp_dim:
    model.shared_expert_mlp_dim = 16
  if model.attention_type == "mla":  # Per-head keys and values.
    model.update(num_kv_heads=4, q_lora_rank=16, kv_lora_rank=16,
                 qk_nope_head_dim=8, v_head_dim=8)
  if model.index_topk:  # DeepSeek Sparse Attention: past the top-k soon.
    model.update(index_topk=4, index_num_heads=16, index_head_dim=8)
  model.update(changes)
  if model.sliding_window:
    model.sliding_window = window
  if model.attention_chunk_size:
    model.attention_chunk_size = window
  return ModelConfig.from_dict(model)
