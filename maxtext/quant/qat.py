"""Quantization-aware training (QAT) with qwix: int8 or fp8 matmuls.

The `qat` config section (`QatConfig`) turns it on for `train`:
`--config.qat.qtype=int8` (or fp8); `--config.qat.module_path=REGEX` picks
the modules. `maxtext.trainers.train_state.create_train_state` then builds
the state's graph definition from the quantized model.

`quantize_for_training(model, config, sample_tokens_BL)` returns a copy of an
NNX decoder whose matmuls (`jnp.tensordot`/`einsum` inside modules whose path
matches `config.module_path`) run on fake-quantized weights and activations
(qwix `QtProvider`, symmetric absmax scales per channel, straight-through
gradients). The parameters stay in their float dtype, so the train state,
optimizer and checkpoints are unchanged; the model's graph definition carries
the quantization, e.g. `nnx.split(quantized)` gives the graphdef a train step
merges with the parameters.

The module path is matched against paths like `blocks/attention/query`
(scanned layers: the stacked `blocks`) or `blocks/0/mlp/up` (unrolled), and
`head`; the default quantizes the attention and MLP projections and leaves
the embedding and output head in full precision.

Shapes: B batch, L length.
"""

import dataclasses

from flax import nnx
import jax
import qwix

# Config name -> the dtype weights and activations are quantized to.
QTYPES = {"int8": "int8", "fp8": "float8_e4m3fn"}
NONE = "none"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QatConfig:
  """What to quantize during training (the `qat` config section).

  Attributes:
    qtype: "none" (off), "int8" or "fp8" (float8 e4m3).
    module_path: Regex over module paths; matching modules' matmuls are
      quantized.
  """

  qtype: str = NONE
  module_path: str = r".*(attention|mlp).*"

  def __post_init__(self):
    if self.qtype != NONE and self.qtype not in QTYPES:
      raise ValueError(f"qat.qtype={self.qtype!r} is invalid; valid:"
                       f" {[NONE, *sorted(QTYPES)]}.")

  @property
  def enabled(self) -> bool:
    return self.qtype != NONE


def quantize_for_training(model: nnx.Module, config: QatConfig,
                          sample_tokens_BL: jax.Array) -> nnx.Module:
  """A copy of `model` with quantized matmuls (same parameters).

  Args:
    model: A decoder (`maxtext.models.registry.create_model`).
    config: What to quantize.
    sample_tokens_BL: Any tokens of the training shape; qwix runs the model
      once on them to find the matmuls.

  Raises:
    ValueError: `config` is off ("none"), or `config.module_path` matches
      no matmul of the model.
  """
  if not config.enabled:
    raise ValueError("qat.qtype='none': there is nothing to quantize.")
  qtype = QTYPES[config.qtype]
  provider = qwix.QtProvider([qwix.QtRule(
      module_path=config.module_path, weight_qtype=qtype, act_qtype=qtype)])
  return quantize_with(model, provider, sample_tokens_BL,
                       f"qat.module_path={config.module_path!r}")


def quantize_with(model: nnx.Module, provider, tokens_BL: jax.Array,
                  rule: str) -> nnx.Module:
  """`qwix.quantize_model` through `provider`; ValueError naming `rule`
  when it matches no matmul of the model."""
  quantized = qwix.quantize_model(model, provider, tokens_BL)
  if provider.get_unused_rules():
    raise ValueError(f"{rule} matches no matmul of the model.")
  return quantized
