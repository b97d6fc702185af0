"""Typed config of a post-training run (`configs/sft.py`, `dpo.py`,
`distill.py`).

`PosttrainConfig.from_config_dict(config)` builds frozen sections through
the config front door (`maxtext.common.sections`: unknown keys are named
with the closest valid one, mistyped values with the type they need, the
user's paths resolved). The model comes
from the checkpoint `train.load`, so there is no model section; the shared
sections reuse the pre-training dataclasses (`data`, `optimizer`, `mesh`,
`sharding`, and how the model runs: `attention_kernel` and `remat`, see
`maxtext.models.execution`), the rest are defined here or next to their
code (`lora`, `distill`). Sections, in order: attention_kernel, remat, data,
optimizer, train, lora, mesh, sharding, export, logging, plus the method's
own: `sft` (methods sft and distill:
prompt/completion columns), `dpo` (dpo, orpo), `distill` (distill).
"""

from collections.abc import Mapping
import dataclasses
from typing import Any

from maxtext.common import paths
from maxtext.common import sections
from maxtext.data.data_config import DataConfig
from maxtext.kernels.dispatch import Kernel
from maxtext.layers.remat import RematConfig
from maxtext.models.execution import Execution
from maxtext.optim.optimizer import OptimizerConfig
from maxtext.posttrain.lora import LoraConfig
from maxtext.sharding.mesh import MeshConfig
from maxtext.sharding.rules import ShardingConfig

METHODS = ("sft", "dpo", "orpo", "distill")
DPO_REFERENCES = ("initial", "none")
SCHEDULES = ("constant", "linear", "cosine")
FEATURE_LOSSES = ("cosine", "l2")
TEACHER_QTYPES = ("", "int8", "nf4")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PosttrainTrainConfig:
  """The `train` section of a post-training run.

  Attributes:
    method: "sft", "dpo", "orpo" (preference data) or "distill".
    load: The starting checkpoint: a converted checkpoint
      (//maxtext/bin:convert_ckpt), a training checkpoint or workdir.
    steps: Optimizer updates.
    batch_size: Sequences (or preference pairs) per update.
    microbatches: Gradient accumulation: each update averages the gradients
      of this many slices of `batch_size / microbatches` rows.
    seed: Seeds the adapters' initialisation.
    checkpoint_every_steps: Save the trainable state (adapters only under
      LoRA) every this many updates under <workdir>/tunix_checkpoints; a
      rerun resumes from the newest. 0: only at the end.
    max_checkpoints: Checkpoints kept.
    compiled: An sft step saved by `aot_compile --save` for this run, to
      train with instead of compiling it (`maxtext.posttrain.compiled_step`;
      refused when compiled for another run). "" compiles it.
  """

  method: str
  load: str = paths.field()
  steps: int
  batch_size: int
  microbatches: int = 1
  seed: int = 0
  checkpoint_every_steps: int = 0
  max_checkpoints: int = 2
  compiled: str = paths.field(default="")

  def __post_init__(self):
    if self.method not in METHODS:
      raise ValueError(
          f"train.method={self.method!r} is invalid; valid: {METHODS}.")
    if self.compiled and self.method != "sft":
      raise ValueError(
          f"train.compiled={self.compiled!r}: only 'sft' trains with a step"
          f" compiled ahead of time, not train.method={self.method!r};"
          " leave it empty.")
    if not self.load:
      raise ValueError("train.load is empty: give the starting checkpoint"
                       " (--load=DIR or --config.train.load=DIR).")
    for name in ("steps", "batch_size", "microbatches", "max_checkpoints"):
      sections.check_int(f"train.{name}", getattr(self, name), minimum=1)
    sections.check_int("train.checkpoint_every_steps",
                       self.checkpoint_every_steps, minimum=0)
    if self.batch_size % self.microbatches:
      raise ValueError(f"train.microbatches={self.microbatches} must divide"
                       f" train.batch_size={self.batch_size}.")

  @property
  def rows(self) -> int:
    """Rows of one microbatch."""
    return self.batch_size // self.microbatches


@dataclasses.dataclass(frozen=True, kw_only=True)
class SftConfig:
  """The `sft` section.

  Attributes:
    prompt_field: With `completion_field`: records hold a prompt and a
      completion column instead of `data.text_field` messages; they become
      a user and an assistant turn of the chat template. Empty: messages.
    completion_field: See `prompt_field`.
    train_vision: A vision-language model's vision tower trains too (full
      fine-tuning); False: it stays frozen (its projector trains). LoRA
      adapts only what `lora.module_path` matches.
  """

  prompt_field: str = ""
  completion_field: str = ""
  train_vision: bool = False

  def __post_init__(self):
    if bool(self.prompt_field) != bool(self.completion_field):
      raise ValueError(
          f"sft.prompt_field={self.prompt_field!r} and sft.completion_field="
          f"{self.completion_field!r}: set both (prompt/completion columns)"
          " or neither (messages in data.text_field).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DpoConfig:
  """The `dpo` section (methods "dpo" and "orpo").

  Attributes:
    beta: DPO: scale of the implicit reward beta * log(pi / pi_ref).
    label_smoothing: Probability that a preference label is flipped
      (conservative DPO / ORPO).
    lambda_orpo: ORPO: weight of the odds-ratio term added to the SFT loss.
    reference: DPO: "initial" (the starting model, frozen) or "none"
      (reference-free). ORPO never uses one.
    prompt_field: Field of each record with the prompt (a string, or a list
      of messages).
    chosen_field: Field with the preferred response (a string).
    rejected_field: Field with the rejected response (a string).
    max_prompt_length: Prompt tokens kept (the last ones), left-padded.
    max_response_length: Response tokens kept, right-padded.
  """

  beta: float = 0.1
  label_smoothing: float = 0.0
  lambda_orpo: float = 0.1
  reference: str = "initial"
  prompt_field: str = "prompt"
  chosen_field: str = "chosen"
  rejected_field: str = "rejected"
  max_prompt_length: int = 64
  max_response_length: int = 64

  def __post_init__(self):
    if not self.beta > 0:
      raise ValueError(f"dpo.beta={self.beta!r} must be positive.")
    if not 0 <= self.label_smoothing < 0.5:
      raise ValueError(
          f"dpo.label_smoothing={self.label_smoothing!r} must be in"
          " [0, 0.5).")
    if self.lambda_orpo < 0:
      raise ValueError(f"dpo.lambda_orpo={self.lambda_orpo!r} must be >= 0.")
    if self.reference not in DPO_REFERENCES:
      raise ValueError(f"dpo.reference={self.reference!r} is invalid; valid:"
                       f" {DPO_REFERENCES}.")
    for name in ("max_prompt_length", "max_response_length"):
      sections.check_int(f"dpo.{name}", getattr(self, name), minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillConfig:
  """The `distill` section.

  loss = alpha * T^2 * KL(teacher_T || student_T)
         + (1 - alpha) * CE(labels) + beta * feature loss,
  with alpha and beta following their schedules from the start value at
  update 0 to the end value at the last update.

  Attributes:
    teacher: The teacher's checkpoint (any size or family whose tokenizer
      matches the student's; same vocabulary size).
    temperature: T, softening both distributions.
    alpha: Weight of the distillation term at update 0.
    alpha_end: Its weight at the last update.
    alpha_schedule: "constant" (alpha throughout), "linear" or "cosine".
    beta: Weight of the feature loss at update 0.
    beta_end: At the last update.
    beta_schedule: As `alpha_schedule`.
    feature_layers: Pairs (student layer, teacher layer) whose block
      outputs are compared; empty: no feature loss. The widths must match.
    feature_loss: "cosine" (1 - cosine similarity per token) or "l2" (mean
      squared difference).
    teacher_qtype: Quantize the frozen teacher's kernels: "" (no), "int8"
      or "nf4".
  """

  teacher: str = paths.field()
  temperature: float = 2.0
  alpha: float = 0.5
  alpha_end: float = 0.5
  alpha_schedule: str = "constant"
  beta: float = 0.0
  beta_end: float = 0.0
  beta_schedule: str = "constant"
  feature_layers: Any = ()
  feature_loss: str = "cosine"
  teacher_qtype: str = ""

  def __post_init__(self):
    if not self.teacher:
      raise ValueError("distill.teacher is empty: give the teacher's"
                       " checkpoint.")
    if not self.temperature > 0:
      raise ValueError(
          f"distill.temperature={self.temperature!r} must be positive.")
    for name in ("alpha", "alpha_end"):
      if not 0 <= getattr(self, name) <= 1:
        raise ValueError(
            f"distill.{name}={getattr(self, name)!r} must be in [0, 1].")
    for name in ("beta", "beta_end"):
      if getattr(self, name) < 0:
        raise ValueError(
            f"distill.{name}={getattr(self, name)!r} must be >= 0.")
    for name in ("alpha_schedule", "beta_schedule"):
      if getattr(self, name) not in SCHEDULES:
        raise ValueError(f"distill.{name}={getattr(self, name)!r} is"
                         f" invalid; valid: {SCHEDULES}.")
    if self.feature_loss not in FEATURE_LOSSES:
      raise ValueError(f"distill.feature_loss={self.feature_loss!r} is"
                       f" invalid; valid: {FEATURE_LOSSES}.")
    if self.teacher_qtype not in TEACHER_QTYPES:
      raise ValueError(f"distill.teacher_qtype={self.teacher_qtype!r} is"
                       f" invalid; valid: {TEACHER_QTYPES}.")
    try:
      pairs = tuple((int(s), int(t)) for s, t in self.feature_layers)
    except (TypeError, ValueError):
      raise ValueError(
          f"distill.feature_layers={self.feature_layers!r} must be pairs"
          " (student layer, teacher layer).") from None
    object.__setattr__(self, "feature_layers", pairs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportConfig:
  """The `export` section: what the run writes when it ends.

  Attributes:
    merged: <workdir>/export: a converted checkpoint of the trained model
      (adapters merged into the base weights), in the starting checkpoint's
      layout, with its tokenizer files, which //maxtext/bin:decode and
      //maxtext/bin:convert_ckpt --to_hf read.
    hf: Also <workdir>/hf: that checkpoint as a Hugging Face folder.
    peft_adapter: Also <workdir>/peft_adapter (LoRA runs): the adapters as a
      Hugging Face PEFT folder over the base model.
  """

  merged: bool = True
  hf: bool = False
  peft_adapter: bool = False

  def __post_init__(self):
    if self.hf and not self.merged:
      raise ValueError("export.hf=True needs export.merged=True (the Hugging"
                       " Face folder is written from the merged checkpoint).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PosttrainLoggingConfig:
  """The `logging` section.

  Attributes:
    tensorboard: Also write TensorBoard events (metrics always go to the log
      and <workdir>/metrics.jsonl).
  """

  tensorboard: bool = True


COMMON_SECTIONS = {
    "attention_kernel": Kernel,
    "remat": RematConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "train": PosttrainTrainConfig,
    "lora": LoraConfig,
    "mesh": MeshConfig,
    "sharding": ShardingConfig,
    "export": ExportConfig,
    "logging": PosttrainLoggingConfig,
}
# The sections of each method besides the common ones.
METHOD_SECTIONS = {
    "sft": {"sft": SftConfig},
    "dpo": {"dpo": DpoConfig},
    "orpo": {"dpo": DpoConfig},
    "distill": {"sft": SftConfig, "distill": DistillConfig},
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PosttrainConfig:
  """Every section of a post-training run; the method's own sections are
  set (`METHOD_SECTIONS`), the others None."""

  data: DataConfig
  optimizer: OptimizerConfig
  train: PosttrainTrainConfig
  lora: LoraConfig
  mesh: MeshConfig
  sharding: ShardingConfig
  export: ExportConfig
  logging: PosttrainLoggingConfig
  attention_kernel: Kernel = Kernel()
  remat: RematConfig = RematConfig()
  sft: SftConfig | None = None
  dpo: DpoConfig | None = None
  distill: DistillConfig | None = None

  @classmethod
  def from_config_dict(cls, config: Mapping[str, Any]) -> "PosttrainConfig":
    """Builds and validates every section of `config`.

    Raises:
      ValueError: a section or key is unknown or missing, or a value is
        invalid; the message names it.
    """
    if hasattr(config, "to_dict"):
      config = config.to_dict()
    method = config.get("train", {}).get("method")
    if method not in METHOD_SECTIONS:
      raise ValueError(
          f"train.method={method!r} is invalid; valid: {METHODS}.")
    built = sections.build_sections(
        config, {**COMMON_SECTIONS, **METHOD_SECTIONS[method]})
    if built["optimizer"].z_loss:
      raise ValueError("optimizer.z_loss must be 0 in post-training (the"
                       " Tunix losses have no z-loss term).")
    if method != "sft" and built["data"].images_per_row:
      raise ValueError(
          f"data.images_per_row={built['data'].images_per_row}: train.method"
          f"={method!r} reads no images yet; only 'sft' does (use 0).")
    return cls(**built)

  @property
  def execution(self) -> Execution:
    """How the models run (post-training does not pipeline)."""
    return Execution(attention_kernel=self.attention_kernel,
                     remat=self.remat)
