"""Test helper: the llama3 config shrunk to compile in seconds."""

from collections.abc import Mapping

import ml_collections

from configs import llama3
from maxtext.trainers.config import ExperimentConfig


def tiny_config(ici: Mapping[str, int] | None = None, *,
                attention_impl: str = "auto",
                **model) -> ml_collections.ConfigDict:
  """llama3's small config with a tiny model on synthetic data.

  Args:
    ici: ICI mesh sizes (default: FSDP over every device).
    attention_impl: `attention_kernel.impl`.
    **model: Model fields to change.
  """
  config = llama3.get_config()
  config.model.update(vocab_size=128, num_layers=2, embed_dim=64, mlp_dim=128,
                      num_heads=4, num_kv_heads=2, head_dim=16)
  config.model.update(model)
  config.attention_kernel.impl = attention_impl
  config.data.source = "synthetic"
  config.data.seq_len = 32
  config.train.batch_size = 8
  config.mesh.ici.update(ici or dict(data=1, fsdp=-1))
  return config


def tiny_experiment(ici: Mapping[str, int] | None = None, *,
                    attention_impl: str = "auto",
                    **model) -> ExperimentConfig:
  """`tiny_config(ici, attention_impl=..., **model)`, typed."""
  return ExperimentConfig.from_config_dict(
      tiny_config(ici, attention_impl=attention_impl, **model))
