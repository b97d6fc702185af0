"""Typed config of an RL run (`configs/grpo.py`).

`RlRunConfig.from_config_dict(config)` builds frozen sections through the
config front door (`maxtext.common.sections`: unknown keys are named with
the closest valid one, the user's paths resolved). Sections, in order: model (only for a run from
scratch), data, optimizer, train, rl, rollout, lora, mesh, sharding, export,
logging. The shared ones reuse the post-training and pre-training
dataclasses; `data`, `train`, `rl` and `rollout` are RL's own. The field
names `train.rows`, `train.microbatches`, `train.checkpoint_every_steps`,
`data.eval_every_steps` and `data.tokenizer` are those the post-training
runtime (`maxtext.posttrain.runtime`) reads.
"""

from collections.abc import Mapping
import dataclasses
from typing import Any

from maxtext.common import paths
from maxtext.common import sections
from maxtext.common.model_config import ModelConfig
from maxtext.data import chat_template as chat_lib
from maxtext.kernels.dispatch import Kernel
from maxtext.layers.remat import RematConfig
from maxtext.models.execution import Execution
from maxtext.optim.optimizer import OptimizerConfig
from maxtext.posttrain.config import ExportConfig
from maxtext.posttrain.config import PosttrainLoggingConfig
from maxtext.posttrain.lora import LoraConfig
from maxtext.sharding.mesh import MeshConfig
from maxtext.sharding.rules import ShardingConfig

FILE_SOURCES = ("jsonl", "parquet", "arrayrecord", "arrow")
TOY_SOURCE = "toy_arithmetic"
# The generated word problems (`maxtext.rl.word_problems`), by split.
WORD_PROBLEM_SOURCES = {"word_problems": "standard",
                        "word_problems_easy": "easy"}
GENERATED_SOURCES = (TOY_SOURCE, *WORD_PROBLEM_SOURCES)
LOSS_ALGOS = ("grpo", "gspo-token")
ENGINES = ("jax", "vllm")
KL_MODES = ("kl", "mse_kl", "low_var_kl")
# Tunix's loss aggregations and advantage estimators.
LOSS_AGG_MODES = ("token-mean", "sequence-mean-token-mean",
                  "sequence-mean-token-scale", "seq-mean-token-sum",
                  "sequence-mean-token-sum-norm")
ADVANTAGE_ESTIMATORS = ("grpo", "drgrpo", "rloo")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RlDataConfig:
  """The `data` section: prompts (and the columns rewards read).

  Attributes:
    source: "jsonl", "parquet", "arrayrecord" or "arrow" files; or
      "toy_arithmetic": the run writes the toy task (one-digit sums, answered
      "#### N") and its word tokenizer to <workdir>/toy and uses them; or
      "word_problems" ("word_problems_easy"): the run writes the bundled
      arithmetic word problems' train and held-out sets
      (`maxtext.rl.word_problems`, standard or easy split) to
      <workdir>/word_problems, trains on the first and evaluates on the
      second (with `eval_every_steps`).
    files: Comma-separated glob patterns of the prompt records.
    eval_files: Records evaluated every `eval_every_steps` updates.
    eval_every_steps: 0: no evaluation.
    prompt_field: Field with the prompt text.
    columns: Other fields passed to the reward functions by name (e.g.
      "answer" for `exact_answer`).
    tokenizer: The tokenizer file; "": the starting checkpoint's
      tokenizer.json.
    chat_template: "": prompts are used as they are; else a built-in
      template name, a .jinja file or a tokenizer_config.json: each prompt
      becomes a user turn followed by the assistant's generation prompt.
    shuffle_seed: Order of the records, reshuffled every epoch.
  """

  source: str = "jsonl"
  files: str = paths.field(paths.user_patterns, default="")
  eval_files: str = paths.field(paths.user_patterns, default="")
  eval_every_steps: int = 0
  prompt_field: str = "prompt"
  columns: Any = ("answer",)
  tokenizer: str = paths.field(default="")
  chat_template: str = paths.field(chat_lib.user_template, default="")
  shuffle_seed: int = 0

  def __post_init__(self):
    if self.source not in (*FILE_SOURCES, *GENERATED_SOURCES):
      raise ValueError(f"data.source={self.source!r} is invalid; valid:"
                       f" {(*FILE_SOURCES, *GENERATED_SOURCES)}.")
    if self.source not in GENERATED_SOURCES and not self.files:
      raise ValueError(f"data.files is empty: data.source={self.source!r}"
                       " needs it.")
    sections.check_int("data.eval_every_steps", self.eval_every_steps, minimum=0)
    if (self.eval_every_steps and not self.eval_files and
        self.source not in WORD_PROBLEM_SOURCES):
      raise ValueError(f"data.eval_every_steps={self.eval_every_steps} needs"
                       " data.eval_files.")
    object.__setattr__(self, "columns", tuple(self.columns))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RlTrainConfig:
  """The `train` section.

  Attributes:
    load: The starting checkpoint (converted or training); "" starts from
      a random model of the `model` section.
    steps: Policy updates (each batch of prompts gives `rl.num_iterations`).
    batch_size: Prompts per batch (each sampled `rl.num_generations` times).
    mini_batch_size: Prompts per policy update (divides batch_size); 0: the
      whole batch.
    seed: Seeds a model from scratch, LoRA adapters and the sampling.
    checkpoint_every_steps: Save the trainable state every this many updates
      under <workdir>/tunix_checkpoints; 0: only at the end.
    max_checkpoints: Checkpoints kept.
  """

  load: str = paths.field(default="")
  steps: int = 100
  batch_size: int = 8
  mini_batch_size: int = 0
  seed: int = 0
  checkpoint_every_steps: int = 0
  max_checkpoints: int = 2

  def __post_init__(self):
    for name in ("steps", "batch_size", "max_checkpoints"):
      sections.check_int(f"train.{name}", getattr(self, name), minimum=1)
    for name in ("mini_batch_size", "checkpoint_every_steps", "seed"):
      sections.check_int(f"train.{name}", getattr(self, name), minimum=0)
    if self.mini_batch_size and self.batch_size % self.mini_batch_size:
      raise ValueError(
          f"train.mini_batch_size={self.mini_batch_size} must divide"
          f" train.batch_size={self.batch_size}.")

  @property
  def rows(self) -> int:
    """Prompts of one policy update."""
    return self.mini_batch_size or self.batch_size

  @property
  def microbatches(self) -> int:
    """RL accumulates no gradients across microbatches (Tunix)."""
    return 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class RlConfig:
  """The `rl` section: the algorithm (Tunix's `GRPOConfig`) and rewards.

  Attributes:
    loss_algo: "grpo" (token-level importance ratio) or "gspo-token"
      (sequence-level ratio: the mean log-ratio over the completion).
    num_generations: Completions sampled per prompt (G).
    num_iterations: Policy updates per batch of rollouts (mu).
    beta: Weight of the KL to the frozen reference (the starting model);
      0 runs without a reference.
    epsilon: Clipping of the importance ratio to [1 - eps, 1 + eps_high].
    epsilon_high: The upper bound's eps_high (DAPO's clip-higher, e.g.
      0.28); 0 uses `epsilon` (symmetric, GRPO).
    kl_loss_mode: KL estimator: "kl", "mse_kl" or "low_var_kl".
    loss_agg_mode: Tunix's loss aggregation, e.g. "sequence-mean-token-mean"
      (GRPO: each completion's mean, averaged), "token-mean" (DAPO: every
      token of the batch alike), "sequence-mean-token-scale" (Dr. GRPO:
      each completion's sum over rollout.max_new_tokens, averaged).
    advantage_estimator: "grpo" ((r - group mean) / group std), "drgrpo"
      (r - group mean: Dr. GRPO) or "rloo" (r - the others' mean).
    dynamic_sampling_rounds: DAPO's dynamic sampling
      (`maxtext.rl.dynamic_sampling`): groups whose rewards are all equal
      are replaced by informative groups of further batches of prompts, at
      most this many batches sampled per update; 0: off.
    overlong_buffer: The `overlong_penalty` reward's L_cache (DAPO's soft
      overlong punishment): completions longer than rollout.max_new_tokens
      - overlong_buffer tokens get a penalty growing linearly to -1 at
      rollout.max_new_tokens; 0 without that reward.
    rewards: (name, weight) pairs: `maxtext.rl.rewards.REWARDS` names or
      "package.module:function"; the weighted rewards are summed.
    max_words: `length_penalty` counts words beyond this.
  """

  loss_algo: str = "grpo"
  num_generations: int = 4
  num_iterations: int = 1
  beta: float = 0.04
  epsilon: float = 0.2
  epsilon_high: float = 0.0
  kl_loss_mode: str = "kl"
  loss_agg_mode: str = "sequence-mean-token-mean"
  advantage_estimator: str = "grpo"
  dynamic_sampling_rounds: int = 0
  overlong_buffer: int = 0
  rewards: Any = (("exact_answer", 1.0),)
  max_words: int = 16

  def __post_init__(self):
    if self.loss_algo not in LOSS_ALGOS:
      raise ValueError(f"rl.loss_algo={self.loss_algo!r} is invalid; valid:"
                       f" {LOSS_ALGOS}.")
    sections.check_int("rl.num_generations", self.num_generations, minimum=2)
    sections.check_int("rl.num_iterations", self.num_iterations, minimum=1)
    sections.check_int("rl.max_words", self.max_words, minimum=1)
    if self.beta < 0:
      raise ValueError(f"rl.beta={self.beta!r} must be >= 0.")
    if not self.epsilon > 0:
      raise ValueError(f"rl.epsilon={self.epsilon!r} must be positive.")
    if not self.epsilon_high >= 0:
      raise ValueError(f"rl.epsilon_high={self.epsilon_high!r} must be >= 0"
                       " (0: rl.epsilon).")
    sections.check_int("rl.overlong_buffer", self.overlong_buffer, minimum=0)
    sections.check_int("rl.dynamic_sampling_rounds",
                       self.dynamic_sampling_rounds, minimum=0)
    for key, valid in (("kl_loss_mode", KL_MODES),
                       ("loss_agg_mode", LOSS_AGG_MODES),
                       ("advantage_estimator", ADVANTAGE_ESTIMATORS)):
      if getattr(self, key) not in valid:
        raise ValueError(f"rl.{key}={getattr(self, key)!r} is invalid;"
                         f" valid: {valid}.")
    try:
      pairs = tuple((str(name), float(weight)) for name, weight in
                    self.rewards)
    except (TypeError, ValueError):
      raise ValueError(f"rl.rewards={self.rewards!r} must be (name, weight)"
                       " pairs.") from None
    if not pairs:
      raise ValueError("rl.rewards is empty: give (name, weight) pairs.")
    object.__setattr__(self, "rewards", pairs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
  """The `rollout` section: how completions are sampled.

  Attributes:
    engine: "jax" (the built-in sampler, `maxtext.rl.jax_rollout`) or "vllm"
      (`maxtext.rl.vllm_rollout`, its own environment).
    max_prompt_length: Prompt tokens kept (the last ones).
    max_new_tokens: Most tokens of a completion.
    temperature: Sampling temperature (> 0).
    top_k: 0 is off.
    top_p: 1 is off.
    stop_tokens: Token texts that end a completion besides the EOS.
    pad_to: The built-in sampler pads prompt lengths to a multiple of this
      (one compilation per bucket).
    devices: 0: rollouts share the trainer's devices and weights; N: the
      last N devices form the rollout mesh (fully data parallel) and the
      trainer's mesh gets the others; weights are copied after each update.
  """

  engine: str = "jax"
  max_prompt_length: int = 64
  max_new_tokens: int = 32
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  stop_tokens: Any = ()
  pad_to: int = 16
  devices: int = 0

  def __post_init__(self):
    if self.engine not in ENGINES:
      raise ValueError(f"rollout.engine={self.engine!r} is invalid; valid:"
                       f" {ENGINES}.")
    for name in ("max_prompt_length", "max_new_tokens", "pad_to"):
      sections.check_int(f"rollout.{name}", getattr(self, name), minimum=1)
    sections.check_int("rollout.top_k", self.top_k, minimum=0)
    sections.check_int("rollout.devices", self.devices, minimum=0)
    if not self.temperature > 0:
      raise ValueError(f"rollout.temperature={self.temperature!r} must be"
                       " positive (RL samples).")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"rollout.top_p={self.top_p!r} must be in (0, 1].")
    object.__setattr__(self, "stop_tokens", tuple(self.stop_tokens))


SECTIONS = {
    "attention_kernel": Kernel,
    "remat": RematConfig,
    "data": RlDataConfig,
    "optimizer": OptimizerConfig,
    "train": RlTrainConfig,
    "rl": RlConfig,
    "rollout": RolloutConfig,
    "lora": LoraConfig,
    "mesh": MeshConfig,
    "sharding": ShardingConfig,
    "export": ExportConfig,
    "logging": PosttrainLoggingConfig,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RlRunConfig:
  """Every section of an RL run; `model` only when starting from scratch."""

  data: RlDataConfig
  optimizer: OptimizerConfig
  train: RlTrainConfig
  rl: RlConfig
  rollout: RolloutConfig
  lora: LoraConfig
  mesh: MeshConfig
  sharding: ShardingConfig
  export: ExportConfig
  logging: PosttrainLoggingConfig
  attention_kernel: Kernel = Kernel()
  remat: RematConfig = RematConfig()
  model: ModelConfig | None = None

  @classmethod
  def from_config_dict(cls, config: Mapping[str, Any]) -> "RlRunConfig":
    """Builds and validates every section of `config`.

    Raises:
      ValueError: a section or key is unknown or missing, or a value is
        invalid; the message names it.
    """
    if hasattr(config, "to_dict"):
      config = config.to_dict()
    built = sections.build_sections(config, SECTIONS, optional=("model",))
    if built["optimizer"].z_loss:
      raise ValueError("optimizer.z_loss must be 0 in RL (the Tunix losses"
                       " have no z-loss term).")
    _check_overlong(built["rl"], built["rollout"])
    if not built["train"].load:
      if "model" not in config:
        raise ValueError("train.load is empty and there is no model"
                         " section: give the starting checkpoint"
                         " (--load=DIR) or a model to start from scratch.")
      built["model"] = sections.build_section("model", ModelConfig,
                                              config["model"])
      Execution(attention_kernel=built["attention_kernel"],
                remat=built["remat"]).check(built["model"])
    return cls(**built)

  @property
  def execution(self) -> Execution:
    """How the policy and reference models run (RL does not pipeline)."""
    return Execution(attention_kernel=self.attention_kernel,
                     remat=self.remat)


def _check_overlong(rl: RlConfig, rollout: RolloutConfig) -> None:
  """The `overlong_penalty` reward and `rl.overlong_buffer` go together,
  the buffer within the completion length."""
  overlong = any(name == "overlong_penalty" for name, _ in rl.rewards)
  if overlong and not 0 < rl.overlong_buffer <= rollout.max_new_tokens:
    raise ValueError(
        f"rl.overlong_buffer={rl.overlong_buffer} must be in 1.."
        f"rollout.max_new_tokens={rollout.max_new_tokens} with the"
        " overlong_penalty reward.")
  if rl.overlong_buffer and not overlong:
    raise ValueError(
        f"rl.overlong_buffer={rl.overlong_buffer} is set but rl.rewards has"
        " no 'overlong_penalty': add ('overlong_penalty', 1.0) or set it to"
        " 0.")
