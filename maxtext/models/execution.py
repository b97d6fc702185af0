"""How a model runs, apart from what it is: attention kernel, pipeline, remat.

`ModelConfig` is the architecture (what a converted checkpoint's
`model_config.json` holds). These choices change speed and memory but
neither the parameters nor the outputs, so they are config sections of
their own, each defined and validated next to the code that reads it:

  attention_kernel  `maxtext.kernels.dispatch.Kernel`
  pipeline          `maxtext.layers.pipeline.PipelineConfig`
  remat             `maxtext.layers.remat.RematConfig`

`Execution` carries the three into a model (`Decoder(cfg, execution=...)`);
`check` refuses the combinations a model cannot run, naming the keys.
"""

import dataclasses

from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.layers import pipeline as pipeline_lib
from maxtext.layers import remat as remat_lib

# Config section -> its dataclass (for the binaries' config front doors).
SECTIONS = {
    "attention_kernel": dispatch.Kernel,
    "pipeline": pipeline_lib.PipelineConfig,
    "remat": remat_lib.RematConfig,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Execution:
  """The execution sections of a run (`SECTIONS`); defaults: "auto"
  attention, no pipeline, no remat."""

  attention_kernel: dispatch.Kernel = dispatch.Kernel()
  pipeline: pipeline_lib.PipelineConfig = pipeline_lib.PipelineConfig()
  remat: remat_lib.RematConfig = remat_lib.RematConfig()

  def check(self, cfg: ModelConfig) -> None:
    """Raises ValueError naming the key when `cfg` cannot run so."""
    kernel = self.attention_kernel
    if kernel.impl in ("xla", "cudnn"):
      for field, value, feature in (
          ("attn_logit_softcap", cfg.attention.logit_softcap,
           "attention-logit soft-cap"),
          ("attention_sinks", cfg.attention.sinks, "attention sinks")):
        if value:
          raise ValueError(
              f"attention_kernel.impl={kernel.impl!r} has no {feature}"
              f" (model.{field}={value!r}); use \"auto\","
              ' "reference", "blockwise", "splash" or "pallas_gpu".')
    if kernel.context_parallel == "ring" and cfg.attention.type == "mla":
      raise ValueError(
          'attention_kernel.context_parallel="ring" serves'
          ' attention_type="gqa" layers only; use "allgather" with'
          ' model.attention_type="mla".')
    self._check_pipeline(cfg)

  def _check_pipeline(self, cfg: ModelConfig) -> None:
    stages, repeats = self.pipeline.stages, self.pipeline.repeats
    if stages == 1:
      return

    def refuse(why):
      raise ValueError(f"pipeline.stages={stages}: {why}.")

    if cfg.num_layers % stages:
      refuse(f"must divide model.num_layers={cfg.num_layers}")
    if cfg.num_layers % (stages * repeats):
      valid = [r for r in range(1, cfg.num_layers // stages + 1)
               if cfg.num_layers % (stages * r) == 0]
      raise ValueError(
          f"pipeline.repeats={repeats}: pipeline.stages={stages} * repeats"
          f" must divide model.num_layers={cfg.num_layers}; valid repeats:"
          f" {valid}.")
    if not cfg.scan_layers:
      refuse("pipelining needs model.scan_layers=True")
    for field, value, what in (
        ("num_experts", cfg.moe.num_experts, "experts"),
        ("mtp_layers", cfg.mtp.layers, "multi-token prediction"),
        ("index_topk", cfg.mla.index_topk,
         "DeepSeek Sparse Attention (its indexer's loss)"),
        ("kv_shared_layers", cfg.pattern.kv_shared_layers,
         "keys and values shared across layers"),
        ("per_layer_input_dim", cfg.per_layer_input_dim,
         "per-layer inputs")):
      if value:
        refuse(f"pipelining is not supported with {what} (model.{field}="
               f"{value}); use 1")
    kinds = [kind.name for kind in layer_pattern.kinds(cfg)]
    layers = layer_pattern.layers(cfg)
    chunk = cfg.num_layers // (stages * repeats)
    if len(kinds) > 1 and layers != layers[:chunk] * (stages * repeats):
      refuse(f"with several layer kinds ({kinds}; maxtext.common."
             f"layer_pattern) every chunk of {chunk} layers (num_layers / "
             "(stages * repeats)) must hold the same kinds and windows in"
             " the same order, and this model's chunks differ; choose"
             " stages and repeats whose chunks repeat the pattern, or use 1")
