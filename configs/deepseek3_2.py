"""DeepSeek-V3.2: DeepSeek-V3 with DeepSeek Sparse Attention (each query
attends only to the `index_topk` tokens its lightning indexer scores
highest; `maxtext.models.deepseek3_2`): small models for CPU, and the
published size.

Train the small default (4 layers, 16 experts, attention over 64 of the
tokens before each query) on a CPU:

  tools/bazel run //maxtext/bin:train -- --config=configs/deepseek3_2.py

"671b" follows the Hugging Face config of deepseek-ai/DeepSeek-V3.2-Exp
(DeepSeek-V3's sizes; an indexer of 64 heads of 128, top 2048 tokens).
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(common.DEEPSEEK3_SMALL, index_topk=64, index_num_heads=8,
                  index_head_dim=32),
    "671b": dict(),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config("deepseek3_2", arg, VARIANTS,
                              **common.DEEPSEEK3_SIZES, index_topk=2048,
                              index_num_heads=64, index_head_dim=128)
