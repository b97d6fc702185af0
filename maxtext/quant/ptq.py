"""Int8 weight-only post-training quantization (PTQ) for decoding, with qwix.

`quantize_for_decode(model, config)` returns a copy of an unscanned decoder
whose projection kernels (modules whose path fully matches
`config.module_path`, e.g. `blocks/3/attention/query`, `blocks/3/mlp/up`,
`head`) are stored as int8 with one float32 scale per output channel
(symmetric absmax over the contracted input axes; qwix `PtqProvider`). Their
matmuls then run on the int8 weights (dequantized by the scale); activations
stay in the compute dtype. Embedding lookups are not matmuls and stay in full
precision (with tied embeddings the output projection does too).

qwix rather than our own code: its `PtqProvider` intercepts the
`dot_general` of `maxtext.layers.linear.Linear` and replaces the kernel
variable by the quantized array on the first call, so the model code is
unchanged. It cannot quantize scanned layers: inside the scan the sliced
kernel keeps the stacked `layers` axis name (qwix fails on it) and the new
variable would be created per iteration; nor inside remat. So the model must
be unscanned, without remat (convert with
`maxtext.posttrain.base_model.unstack_layers` first, as `decode
--quantize=int8` does).

Shapes: B batch, L length.
"""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import qwix

from maxtext.quant import qat

# Weight dtypes a decode model can be quantized to.
QTYPES = ("int8",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PtqConfig:
  """What to quantize for decoding.

  Attributes:
    qtype: Storage dtype of the quantized kernels; one of `QTYPES`.
    module_path: Regex fully matching the paths of the modules whose
      kernels are quantized.
  """

  qtype: str = "int8"
  module_path: str = r"\w*blocks/\d+/(attention|mlp)/.*|head"

  def __post_init__(self):
    if self.qtype not in QTYPES:
      raise ValueError(f"quantize={self.qtype!r} is invalid; valid:"
                       f" {list(QTYPES)}.")


def quantize_for_decode(model: nnx.Module, config: PtqConfig) -> nnx.Module:
  """A copy of the unscanned `model` with int8 kernels (see module doc).

  Raises:
    ValueError: `model` has scanned layers or recomputes activations
      (`remat.policy`), or `config.module_path` matches no matmul of it.
  """
  cfg, policy = model.cfg, model.execution.remat.policy
  if cfg.scan_layers or policy != "none":
    raise ValueError(
        f"PTQ needs an unscanned model without remat (model.scan_layers="
        f"{cfg.scan_layers}, remat.policy={policy!r}; want False, 'none');"
        " convert scanned parameters with"
        " maxtext.posttrain.base_model.unstack_layers.")
  provider = qwix.PtqProvider([qwix.QuantizationRule(
      module_path=config.module_path, weight_qtype=config.qtype)])
  # qwix replaces the kernels on this first call; any tokens will do.
  return qat.quantize_with(model, provider, jnp.zeros((1, 1), jnp.int32),
                           f"PTQ module_path={config.module_path!r}")


def param_bytes(model: nnx.Module) -> int:
  """Bytes of the model's parameters (int8 values and scales included)."""
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(
      nnx.to_pure_dict(nnx.state(model, nnx.Param))))
