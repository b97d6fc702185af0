"""LoRA and QLoRA on our models (qwix), merging, and PEFT adapter export.

`apply_lora(model, config, ...)` adds low-rank adapters to the projections
whose module path (e.g. "blocks/3/attention/query", see `module_paths`)
fully matches the regex `config.module_path`, with qwix's
`apply_lora_to_model`: each matched kernel W [in..., out...] gets
`kernel_lora_a` [prod(in), r] and `kernel_lora_b` [r, prod(out)]
(`nnx.LoRAParam`, B initialised to zero) and the layer computes
`x W + (x A B) * alpha / r`. With mode "qlora" the matched kernels are also
quantized to `config.base_qtype` (int8 or nf4, per-channel or in tiles of
`config.tile_size`) and stay frozen; only A and B train.

The adapters need the unscanned layout (`scan_layers=False`: qwix creates
them on the layer modules themselves), which `maxtext.posttrain.base_model`
sets up from any checkpoint.

`merged_params(model, cfg, config)` folds the adapters into the base
weights: W' = W + (A B).reshape(W.shape) * alpha / r, with W dequantized for
QLoRA, so the merged model computes what the adapted model computed (QLoRA:
up to the dequantized base). `save_peft_adapter` writes the adapters as a
Hugging Face PEFT folder (`adapter_config.json`, `adapter_model.safetensors`
with `lora_A` = A^T [r, in], `lora_B` = B^T [out, r] under the Hugging Face
module names of the family's weight map), for `PeftModel.from_pretrained` on
the exported base model.
"""

import dataclasses
import json
import os
import re
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import qwix
from safetensors import numpy as safetensors_numpy

from maxtext.checkpoint import params_checkpoint
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.models import registry

MODES = ("full", "lora", "qlora")
BASE_QTYPES = ("int8", "nf4")
# Every attention and MLP projection of every block.
DEFAULT_MODULE_PATH = (
    r"blocks/\d+/(attention/(query|key|value|output)|mlp/(gate|up|down))")
PEFT_CONFIG_FILENAME = "adapter_config.json"
PEFT_WEIGHTS_FILENAME = "adapter_model.safetensors"
_LORA_A = "_lora_a"
_LORA_B = "_lora_b"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
  """The `lora` config section.

  Attributes:
    mode: "full" (every parameter trains), "lora" (adapters only, base
      frozen) or "qlora" (adapters on a quantized, frozen base).
    rank: Rank r of the adapters.
    alpha: The adapters' output is scaled by alpha / r.
    dropout: Dropout on the adapters' input while training.
    module_path: Regex over module paths (`module_paths`) that must fully
      match a projection to adapt it.
    base_qtype: "qlora": storage type of the frozen base kernels.
    tile_size: "qlora": quantize in tiles of this many input rows (0: one
      scale per output channel); must divide the input size.
  """

  mode: str = "full"
  rank: int = 8
  alpha: float = 16.0
  dropout: float = 0.0
  module_path: str = DEFAULT_MODULE_PATH
  base_qtype: str = "nf4"
  tile_size: int = 0

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"lora.mode={self.mode!r} is invalid; valid: {MODES}.")
    if isinstance(self.rank, bool) or not isinstance(
        self.rank, int) or self.rank < 1:
      raise ValueError(f"lora.rank={self.rank!r} must be a positive integer.")
    if not self.alpha > 0:
      raise ValueError(f"lora.alpha={self.alpha!r} must be positive.")
    if not 0 <= self.dropout < 1:
      raise ValueError(f"lora.dropout={self.dropout!r} must be in [0, 1).")
    try:
      re.compile(self.module_path)
    except re.error as e:
      raise ValueError(f"lora.module_path={self.module_path!r} is not a"
                       f" regex: {e}.") from None
    if self.base_qtype not in BASE_QTYPES:
      raise ValueError(f"lora.base_qtype={self.base_qtype!r} is invalid;"
                       f" valid: {BASE_QTYPES}.")
    if self.tile_size < 0:
      raise ValueError(f"lora.tile_size={self.tile_size!r} must be >= 0 (0:"
                       " per-channel scales).")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def module_paths(model: nnx.Module) -> list[str]:
  """Paths ("blocks/0/attention/query", ...) of the modules that hold a
  kernel, as `LoraConfig.module_path` sees them."""
  return ["/".join(map(str, path)) for path, module in nnx.iter_modules(model)
          if isinstance(getattr(module, "kernel", None), nnx.Param)]


def apply_lora(model: nnx.Module, config: LoraConfig, *, seed: int,
               example_tokens: jax.Array) -> nnx.Module:
  """A copy of `model` with adapters (see the module docstring).

  Args:
    model: An unscanned model (`scan_layers=False`) of our registry, with
      no remat (`execution.remat`) while adapters are created.
    config: Its `lora` section, mode "lora" or "qlora".
    seed: Initialises the A matrices.
    example_tokens: Token ids [B, L] to trace the model once with.

  Raises:
    ValueError: the model is scanned, or `config.module_path` matches no
      projection (the message lists the paths).
  """
  if config.mode not in ("lora", "qlora"):
    raise ValueError(f"apply_lora needs lora.mode 'lora' or 'qlora', got"
                     f" {config.mode!r}.")
  if model.cfg.scan_layers:
    raise ValueError("LoRA needs the unscanned layout (scan_layers=False).")
  paths = module_paths(model)
  if not any(re.fullmatch(config.module_path, p) for p in paths):
    raise ValueError(
        f"lora.module_path={config.module_path!r} matches no projection;"
        f" module paths look like {paths[:8]}.")
  rule = dict(module_path=config.module_path, rank=config.rank,
              alpha=config.alpha, dropout=config.dropout)
  if config.mode == "qlora":
    rule.update(weight_qtype=config.base_qtype,
                tile_size=config.tile_size or None)
  provider = qwix.LoraProvider(**rule)
  return qwix.apply_lora_to_model(model, provider, example_tokens,
                                  rngs=nnx.Rngs(seed))


def is_lora(model: nnx.Module) -> bool:
  """True when `model` has adapters."""
  return bool(jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def dense(variable: Any) -> jax.Array:
  """The float value of a kernel: a parameter, or a qwix-quantized one."""
  if isinstance(variable, nnx.Variable):
    return variable[...]
  return qwix.dequantize(jax.tree.map(
      lambda v: v[...] if isinstance(v, nnx.Variable) else v, variable.array,
      is_leaf=lambda v: isinstance(v, nnx.Variable)))


def _adapters(module: nnx.Module, name: str):
  """(A, B) of parameter `name` of `module`, or None."""
  lora_a = getattr(module, name + _LORA_A, None)
  lora_b = getattr(module, name + _LORA_B, None)
  if lora_a is None or lora_b is None:
    return None
  return lora_a[...], lora_b[...]


def merged_params(model: nnx.Module, cfg: ModelConfig,
                  config: LoraConfig) -> dict[str, Any]:
  """The parameters of `cfg`'s plain model with the adapters folded in.

  Args:
    model: The adapted model (`apply_lora`), or a plain one.
    cfg: Its (unscanned) model config.
    config: Its `lora` section (alpha / rank).

  Returns:
    The nested dict of `params_checkpoint.model_params` for `cfg`.
  """
  target = registry.abstract_model(cfg)
  modules = dict(nnx.iter_modules(model))
  for path, target_module in nnx.iter_modules(target):
    module = modules[path]
    for name, variable in list(vars(target_module).items()):
      if not isinstance(variable, nnx.Param):
        continue
      value = dense(getattr(module, name)).astype(jnp.float32)
      adapters = _adapters(module, name)
      if adapters is not None:
        lora_a, lora_b = adapters
        delta = (lora_a.astype(jnp.float32) @ lora_b.astype(jnp.float32))
        value = value + delta.reshape(value.shape) * config.scale
      variable.set_value(value.astype(variable.dtype))
  return params_checkpoint.model_params(target)


def _hf_names(cfg: ModelConfig
              ) -> dict[tuple[Any, ...], tuple[str, bool]]:
  """{(module path..., parameter name): (Hugging Face weight name, whether
  the parameter is only part of that weight)} of the unscanned model of
  `cfg`."""
  family = registry.family_module(cfg.family)
  names = {entry.path: (entry.hf_name, entry.rows is not None)
           for entry in family.HF_PARAMS}
  for entry in registry.hf_block_params(cfg):
    for name, layers in layer_pattern.kind_layers(cfg).items():
      for slot, layer in enumerate(layers):
        names[(name, slot, *entry.path)] = (entry.hf_name.format(layer=layer),
                                            entry.rows is not None)
  return names


def peft_adapter(model: nnx.Module, cfg: ModelConfig, config: LoraConfig
                 ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(PEFT weights, adapter_config.json) of the adapters of `model`.

  Raises:
    ValueError: the model has no adapters, or one sits on a parameter
      without a Hugging Face name or on part of a fused Hugging Face weight
      (Qwen3-Next's in_proj_qkvz: a PEFT adapter adapts a whole weight).
  """
  hf_names = _hf_names(cfg)
  weights, targets = {}, set()
  for path, module in nnx.iter_modules(model):
    for name in list(vars(module)):
      adapters = _adapters(module, name) if not name.endswith(
          (_LORA_A, _LORA_B)) else None
      if adapters is None:
        continue
      where = f"{'/'.join(map(str, path))}/{name}"
      hf_name, part = hf_names.get((*path, name), ("", False))
      if not hf_name.endswith(".weight"):
        raise ValueError(f"The adapter of {where} has no Hugging Face weight"
                         " to attach to.")
      if part:
        raise ValueError(
            f"The adapter of {where} adapts only part of the Hugging Face"
            f" weight {hf_name}, which PEFT cannot express; leave that"
            " module out of lora.module_path to export a PEFT adapter.")
      prefix = "base_model.model." + hf_name[:-len(".weight")]
      lora_a, lora_b = (np.asarray(x, np.float32) for x in adapters)
      weights[prefix + ".lora_A.weight"] = np.ascontiguousarray(lora_a.T)
      weights[prefix + ".lora_B.weight"] = np.ascontiguousarray(lora_b.T)
      targets.add(hf_name[:-len(".weight")].rsplit(".", 1)[-1])
  if not weights:
    raise ValueError("The model has no LoRA adapters to export.")
  adapter_config = {
      "peft_type": "LORA",
      "task_type": "CAUSAL_LM",
      "r": config.rank,
      "lora_alpha": config.alpha,
      "lora_dropout": config.dropout,
      "target_modules": sorted(targets),
      "bias": "none",
      "fan_in_fan_out": False,
      "inference_mode": True,
      "base_model_name_or_path": None,
  }
  return weights, adapter_config


def save_peft_adapter(out_dir: str, model: nnx.Module, cfg: ModelConfig,
                      config: LoraConfig) -> None:
  """Writes `peft_adapter(...)` as a PEFT folder in `out_dir`."""
  weights, adapter_config = peft_adapter(model, cfg, config)
  os.makedirs(out_dir, exist_ok=True)
  safetensors_numpy.save_file(
      weights, os.path.join(out_dir, PEFT_WEIGHTS_FILENAME),
      metadata={"format": "pt"})
  with open(os.path.join(out_dir, PEFT_CONFIG_FILENAME), "w",
            encoding="utf-8") as f:
    json.dump(adapter_config, f, indent=2)
    f.write("\n")
