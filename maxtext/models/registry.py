"""Model families by name: `create_model(cfg, rngs=...)` for any family.

A family is a module in `maxtext/models/` that exposes:
  MODEL_CLASS: the `nnx.Module` class built as `MODEL_CLASS(cfg, rngs=rngs)`.
  model_config_from_hf(hf_config: dict) -> ModelConfig.
  HF_PARAMS: `maxtext.models.hf_weights.ParamMap` entries for the
    Hugging Face checkpoint layout.
Adding a family adds one entry here; shared code never branches on family.
"""

import types

from flax import nnx

from maxtext.common.model_config import ModelConfig
from maxtext.models import gemma
from maxtext.models import gemma2
from maxtext.models import gemma3
from maxtext.models import llama2
from maxtext.models import llama3
from maxtext.models import mistral
from maxtext.models import qwen2_5
from maxtext.models import qwen3

FAMILIES: dict[str, types.ModuleType] = {
    "gemma": gemma,
    "gemma2": gemma2,
    "gemma3": gemma3,
    "llama2": llama2,
    "llama3": llama3,
    "mistral": mistral,
    "qwen2_5": qwen2_5,
    "qwen3": qwen3,
}


def family_module(family: str) -> types.ModuleType:
  """Returns the module of `family`; ValueError naming the valid families."""
  if family not in FAMILIES:
    raise ValueError(
        f"Unknown model family {family!r}; valid families: {sorted(FAMILIES)}.")
  return FAMILIES[family]


def create_model(cfg: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
  """Builds the model of `cfg.family` with freshly initialised parameters."""
  return family_module(cfg.family).MODEL_CLASS(cfg, rngs=rngs)
