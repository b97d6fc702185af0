"""Model families by name: `create_model(cfg, rngs=...)` for any family.

A family is a module in `maxtext/models/` that exposes:
  MODEL_CLASS: the `nnx.Module` class built as
    `MODEL_CLASS(cfg, rngs=rngs, execution=execution)`.
  ARCHITECTURE: the `ModelConfig` fields the family fixes (its one
    statement of them; `configs/<family>.py` adds sizes).
  model_config_from_hf(hf_config: dict) -> ModelConfig.
  HF_PARAMS: `maxtext.models.hf_weights.ParamMap` entries for the
    Hugging Face checkpoint layout; per layer, HF_BLOCK_PARAMS, or
    `hf_block_params(cfg)` where the entries depend on the sizes
    (`hf_block_params` below serves both).
  HF_MODEL_TYPE, HF_ARCHITECTURE: the Hugging Face `config.json` model_type
    and architecture class name.
  hf_config_from_model_config(cfg) -> dict: the `config.json` of `cfg`.
Adding a family adds one entry here; shared code never branches on family.
"""

import functools
import types

from flax import nnx

from maxtext.common.model_config import ModelConfig
from maxtext.data import image_tiles
from maxtext.data import images as images_lib
from maxtext.models import deepseek2
from maxtext.models import deepseek3
from maxtext.models import deepseek3_2
from maxtext.models import execution as execution_lib
from maxtext.models import gemma
from maxtext.models import gemma2
from maxtext.models import gemma3
from maxtext.models import gemma4
from maxtext.models import gpt_oss
from maxtext.models import llama2
from maxtext.models import llama3
from maxtext.models import llama4
from maxtext.models import mistral
from maxtext.models import mixtral
from maxtext.models import olmo3
from maxtext.models import qwen2_5
from maxtext.models import qwen3_5
from maxtext.models import qwen3_5_moe
from maxtext.models import qwen3
from maxtext.models import qwen3_moe
from maxtext.models import qwen3_next

FAMILIES: dict[str, types.ModuleType] = {
    "deepseek2": deepseek2,
    "deepseek3": deepseek3,
    "deepseek3_2": deepseek3_2,
    "gemma": gemma,
    "gemma2": gemma2,
    "gemma3": gemma3,
    "gemma4": gemma4,
    "gpt_oss": gpt_oss,
    "llama2": llama2,
    "llama3": llama3,
    "llama4": llama4,
    "mistral": mistral,
    "mixtral": mixtral,
    "olmo3": olmo3,
    "qwen2_5": qwen2_5,
    "qwen3_5": qwen3_5,
    "qwen3_5_moe": qwen3_5_moe,
    "qwen3": qwen3,
    "qwen3_moe": qwen3_moe,
    "qwen3_next": qwen3_next,
}

# Hugging Face `config.json` model_type -> family. Llama 2 checkpoints have
# Llama's model_type and load as llama3 (the same model code and layout).
HF_MODEL_TYPES: dict[str, str] = {
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek3",
    "deepseek_v32": "deepseek3_2",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3",  # Multimodal (text decoder only).
    "gemma3_text": "gemma3",
    "gemma4": "gemma4",  # Multimodal (text decoder only).
    "gemma4_text": "gemma4",
    "gpt_oss": "gpt_oss",
    "llama": "llama3",
    "llama4": "llama4",  # Multimodal (with its vision tower).
    "llama4_text": "llama4",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "olmo3": "olmo3",
    "qwen2": "qwen2_5",
    "qwen3": "qwen3",
    "qwen3_5": "qwen3_5",  # Multimodal (text decoder only).
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",  # Multimodal (text decoder only).
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_moe": "qwen3_moe",
    "qwen3_next": "qwen3_next",
}
# Multimodal architectures whose text decoder is a family.
HF_MULTIMODAL_ARCHITECTURES: dict[str, str] = {
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForConditionalGeneration": "gemma4",
    "Llama4ForConditionalGeneration": "llama4",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
}
HF_ARCHITECTURES: dict[str, str] = {
    **{FAMILIES[family].HF_ARCHITECTURE: family
       for family in HF_MODEL_TYPES.values()},
    **HF_MULTIMODAL_ARCHITECTURES,
}


def family_from_hf_config(hf_config: dict) -> str:
  """The family of a Hugging Face `config.json` (its model_type, else its
  architectures); ValueError listing the supported ones."""
  model_type = hf_config.get("model_type")
  if model_type in HF_MODEL_TYPES:
    return HF_MODEL_TYPES[model_type]
  for architecture in hf_config.get("architectures") or ():
    if architecture in HF_ARCHITECTURES:
      return HF_ARCHITECTURES[architecture]
  raise ValueError(
      f"Unsupported Hugging Face architecture (model_type={model_type!r}, "
      f"architectures={hf_config.get('architectures')}); supported "
      f"model_types: {sorted(HF_MODEL_TYPES)}, architectures: "
      f"{sorted(HF_ARCHITECTURES)}.")


def hf_text_config(hf_config: dict) -> dict:
  """The text decoder's settings of a Hugging Face `config.json`: its
  `text_config` when it has one (a multimodal model), else itself."""
  return hf_config.get("text_config") or hf_config


def model_config_from_hf(family: str, hf_config: dict) -> ModelConfig:
  """`ModelConfig` of a Hugging Face `config.json` of `family`: the
  vision-language model where the family has one (`HF_VISION_PARAMS`),
  else the text decoder (`hf_text_config`)."""
  module = family_module(family)
  if hasattr(module, "HF_VISION_PARAMS"):
    return module.model_config_from_hf(hf_config)
  return module.model_config_from_hf(hf_text_config(hf_config))


def family_module(family: str) -> types.ModuleType:
  """Returns the module of `family`; ValueError naming the valid families."""
  if family not in FAMILIES:
    raise ValueError(
        f"Unknown model family {family!r}; valid families: {sorted(FAMILIES)}.")
  return FAMILIES[family]


def image_inputs(cfg: ModelConfig, folder: str) -> images_lib.ImageInputs:
  """How images reach `cfg`'s vision tower: the preprocessing of its
  checkpoint `folder` (`images.model_settings`), what the tower takes of an
  image (`image_tiles.model_pixels`: Llama 4's tiles) and the family's
  `image_prompt_ids`."""
  settings = images_lib.model_settings(cfg.vision, folder)
  return images_lib.ImageInputs(
      settings,
      functools.partial(family_module(cfg.family).image_prompt_ids,
                        cfg.vision),
      functools.partial(image_tiles.model_pixels, cfg.vision, settings))


def hf_block_params(cfg: ModelConfig) -> tuple:
  """The per-layer Hugging Face entries of `cfg`'s family and sizes."""
  module = family_module(cfg.family)
  if hasattr(module, "hf_block_params"):
    return module.hf_block_params(cfg)
  return module.HF_BLOCK_PARAMS


def create_model(cfg: ModelConfig, *, rngs: nnx.Rngs,
                 execution: execution_lib.Execution = execution_lib.Execution()
                 ) -> nnx.Module:
  """Builds the model of `cfg.family` with freshly initialised parameters,
  to run under `execution` (attention kernel, pipeline, remat)."""
  return family_module(cfg.family).MODEL_CLASS(cfg, rngs=rngs,
                                               execution=execution)


def abstract_model(
    cfg: ModelConfig,
    execution: execution_lib.Execution = execution_lib.Execution()
) -> nnx.Module:
  """`cfg`'s model with `jax.ShapeDtypeStruct` values (nothing initialised or
  allocated), to run under `execution` once its values are set. A new model
  each call; the tracing it costs is done once per (cfg, execution)."""
  return nnx.merge(*_abstract_split(cfg, execution), copy=True)


@functools.lru_cache(maxsize=16)
def _abstract_split(cfg: ModelConfig, execution: execution_lib.Execution):
  return nnx.split(nnx.eval_shape(lambda: create_model(
      cfg, rngs=nnx.Rngs(0), execution=execution)))
