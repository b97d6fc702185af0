"""The model a post-training run starts from, and what it exports.

`load_model(path, ...)` reads any checkpoint `params_checkpoint.load_params`
accepts, converts it to the unscanned layout (LoRA adapters and feature
capture sit on the layer modules themselves), places the parameters on the
mesh by their logical axes and the parameter rules (their metadata then
names mesh axes, as Tunix expects), adds LoRA/QLoRA
adapters or quantizes (a frozen teacher) as asked, and wraps the model in
the Tunix adapter (`maxtext.posttrain.adapter.TunixModel`).

`export(...)` writes the trained model as a converted checkpoint in the
starting checkpoint's layout and dtype (adapters merged), with the
tokenizer files and original Hugging Face config of the starting
checkpoint, so `//maxtext/bin:decode` and `//maxtext/bin:convert_ckpt --to_hf`
read it directly; optionally also the Hugging Face folder and the PEFT
adapter.
"""

import dataclasses
import os
import shutil
from typing import Any

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import qwix

from maxtext.checkpoint import hf_convert
from maxtext.checkpoint import params_checkpoint
from maxtext.common import exports
from maxtext.common.model_config import ModelConfig
from maxtext.layers import remat
from maxtext.models import execution as execution_lib
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.posttrain import lora as lora_lib
from maxtext.sharding import rules as rules_lib

def _block_groups(params: dict[str, Any]) -> list[str]:
  """The layer kinds' stacks in a decoder's parameters (`layer_pattern`:
  every kind's stack is named "...blocks")."""
  return [name for name in params
          if isinstance(name, str) and name.endswith("blocks")]


def _map_stacks(params: dict[str, Any], fn) -> dict[str, Any]:
  """`params` with `fn` applied to each stack of layers: every layer kind's
  blocks and a vision tower's layers (`vision.layers`)."""
  params = dict(params)
  for group in _block_groups(params):
    if params.get(group):
      params[group] = fn(params[group])
  if isinstance(params.get("vision"), dict) and params["vision"].get("layers"):
    params["vision"] = {**params["vision"],
                        "layers": fn(params["vision"]["layers"])}
  return params


def _unstack(stacked):
  count = jax.tree.leaves(stacked)[0].shape[0]
  return {layer: jax.tree.map(lambda a, i=layer: a[i], stacked)
          for layer in range(count)}


def _stack(layers):
  return jax.tree.map(lambda *a: jnp.stack(a),
                      *[layers[layer] for layer in sorted(layers)])


def unstack_layers(params: dict[str, Any]) -> dict[str, Any]:
  """Scanned-layout parameters (layers stacked) -> unscanned ones."""
  return _map_stacks(params, _unstack)


def stack_layers(params: dict[str, Any]) -> dict[str, Any]:
  """Unscanned-layout parameters -> scanned ones (inverse of unstack)."""
  return _map_stacks(params, _stack)


@dataclasses.dataclass
class LoadedModel:
  """A model ready for a Tunix trainer.

  Attributes:
    model: The adapter around the (possibly LoRA-adapted) model.
    cfg: The config it runs with (unscanned).
    checkpoint_cfg: The starting checkpoint's config (its layout, for export).
    path: The starting checkpoint.
  """

  model: adapter.TunixModel
  cfg: ModelConfig
  checkpoint_cfg: ModelConfig
  path: str


def _place(params: dict[str, Any], cfg: ModelConfig,
           rules: rules_lib.LogicalRules | None) -> dict[str, Any]:
  if rules is None:
    return params
  names = rules_lib.logical_names(nnx.state(
      registry.abstract_model(cfg), nnx.Param))
  return jax.tree.map(
      lambda n, x: jax.device_put(x, rules.param_sharding(n, x.shape)),
      names, params, is_leaf=lambda x: isinstance(x, tuple))


def to_mesh_axes(model: nnx.Module,
                  rules: rules_lib.LogicalRules | None) -> None:
  """Rewrites each parameter's sharding metadata from logical axis names to
  the mesh axes of `rules` (Tunix shards the optimizer state by it)."""
  if rules is None:
    return
  for _, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Param) and node.get_metadata().get(
        "out_sharding"):
      spec = rules.param_spec(node.get_metadata()["out_sharding"], node.shape)
      node.set_metadata(out_sharding=tuple(spec) + (None,) * (
          node.ndim - len(spec)))


def load_model(path: str, *, lora: lora_lib.LoraConfig | None = None,
               quantize: str = "", seed: int = 0,
               rules: rules_lib.LogicalRules | None = None,
               execution: execution_lib.Execution = execution_lib.Execution()
               ) -> LoadedModel:
  """The model of checkpoint `path`, ready to train or to serve a trainer.

  Args:
    path: Any checkpoint `params_checkpoint.load_params` reads.
    lora: The `lora` section; mode "lora"/"qlora" adds adapters.
    quantize: "int8" or "nf4": quantize every attention and MLP projection
      (a frozen teacher); "" keeps float weights.
    seed: Initialises the adapters.
    rules: Places the parameters and constrains activations on the mesh.
    execution: How the model runs (attention kernel, remat).

  Raises:
    params_checkpoint.ParamsCheckpointError: the checkpoint cannot be read.
  """
  checkpoint_cfg, params = params_checkpoint.load_params(path)
  cfg = checkpoint_cfg.replace(scan_layers=False)
  if checkpoint_cfg.scan_layers:
    params = unstack_layers(params)
  params = _place(params, cfg, rules)
  adapted = lora is not None and lora.mode != "full"
  if adapted or quantize:
    # qwix creates its variables on a first call, which must see the layer
    # modules themselves (no remat around them).
    model = params_checkpoint.model_from_params(
        cfg, params, dataclasses.replace(execution,
                                         remat=remat.RematConfig()))
    to_mesh_axes(model, rules)
    example = jnp.zeros((1, 8), jnp.int32)
    if adapted:
      model = lora_lib.apply_lora(model, lora, seed=seed,
                                  example_tokens=example)
    else:
      model = qwix.quantize_model(model, qwix.PtqProvider(
          [qwix.QuantizationRule(module_path=lora_lib.DEFAULT_MODULE_PATH,
                                 weight_qtype=quantize)]), example)
    model.execution = execution
  else:
    model = params_checkpoint.model_from_params(cfg, params, execution)
    to_mesh_axes(model, rules)
  return LoadedModel(model=adapter.TunixModel(model, rules), cfg=cfg,
                     checkpoint_cfg=checkpoint_cfg, path=path)


def trainable_filter(model: nnx.Module):
  """The variables a trainer updates: the adapters if there are any."""
  return nnx.LoRAParam if lora_lib.is_lora(model) else nnx.Param


def _copy_checkpoint_files(source: str, out_dir: str,
                           tokenizer: str) -> list[str]:
  """Copies the starting checkpoint's tokenizer and HF config files; the
  data tokenizer when the checkpoint has none."""
  copied = []
  for name in (*hf_convert.EXTRA_FILES, hf_convert.ORIGINAL_HF_CONFIG_FILENAME):
    if os.path.isfile(os.path.join(source, name)):
      shutil.copyfile(os.path.join(source, name), os.path.join(out_dir, name))
      copied.append(name)
  has_tokenizer = any(n in copied for n in hf_convert.TOKENIZER_FILES)
  if not has_tokenizer and tokenizer and os.path.isfile(tokenizer):
    name = ("tokenizer.json" if tokenizer.endswith(".json") else
            "tokenizer.model")
    shutil.copyfile(tokenizer, os.path.join(out_dir, name))
    copied.append(name)
  return copied


def export(workdir: str, loaded: LoadedModel, lora: lora_lib.LoraConfig, *,
           merged: bool, hf: bool, peft_adapter: bool,
           tokenizer: str) -> dict[str, str]:
  """Writes the trained model (see the module docstring).

  Args:
    workdir: Output folders go here: export/, hf/, peft_adapter/.
    loaded: The trained model.
    lora: The run's `lora` section.
    merged: Write the merged converted checkpoint.
    hf: Also write the Hugging Face folder.
    peft_adapter: Also write the PEFT adapter (LoRA runs only).
    tokenizer: The data tokenizer, copied when the checkpoint has none.

  Returns:
    {"export"|"hf"|"peft_adapter": folder} of what was written.

  Each folder is written whole or not at all and replaces what an earlier
  export of the workdir left there (`maxtext.common.exports`).

  Raises:
    ValueError: a PEFT adapter is asked of a run without adapters.
    exports.ExportTargetError: a folder would overwrite the starting
      checkpoint.
  """
  model = loaded.model.model
  written = {}
  if peft_adapter:
    written["peft_adapter"] = os.path.join(workdir, "peft_adapter")
    with _writing(written["peft_adapter"], loaded, "peft_adapter") as folder:
      lora_lib.save_peft_adapter(folder, model, loaded.cfg, lora)
  if not merged:
    return written
  params = lora_lib.merged_params(model, loaded.cfg, lora)
  cfg = loaded.checkpoint_cfg
  if cfg.scan_layers:
    params = stack_layers(params)
  out_dir = written["export"] = os.path.join(workdir, "export")
  with _writing(out_dir, loaded, "converted") as folder:
    params_checkpoint.save_converted(folder, cfg, params)
    copied = _copy_checkpoint_files(loaded.path, folder, tokenizer)
  logging.info("Exported the trained %s model to %s (copied %s).", cfg.family,
               out_dir, copied or "no tokenizer files")
  if hf:
    written["hf"] = os.path.join(workdir, "hf")
    hf_convert.orbax_to_hf(out_dir, written["hf"], owned=True)
  return written


EXPORT_FOLDERS = ("export", "hf", "peft_adapter")


def check_export_folders(workdir: str, load: str) -> None:
  """Refuses, before a run starts, a starting checkpoint `load` that the
  run's exports (`EXPORT_FOLDERS` of `workdir`) would overwrite.

  Raises:
    exports.ExportTargetError: naming both.
  """
  for name in EXPORT_FOLDERS:
    exports.check_target(os.path.join(workdir, name), sources=(load,),
                         owned=True)


def _writing(target: str, loaded: LoadedModel, kind: str):
  """`exports.writing` into the run's own workdir (an earlier export there
  is replaced, atomically), never over the starting checkpoint."""
  return exports.writing(target, sources=(loaded.path,), kind=kind,
                         owned=True)
