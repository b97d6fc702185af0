"""Online distillation on Tunix's `DistillationTrainer`.

`run(config, workdir)` is what `//maxtext/bin:distill` runs: the student
(`train.load`, trained: full, LoRA or QLoRA as in SFT) and the teacher
(`distill.teacher`, frozen, optionally int8/nf4) are models of our library,
of any sizes and families whose vocabularies match, in one process. The
data is SFT data (`maxtext.posttrain.sft.data_config`: packed chat rows
whose `mask` marks the assistant tokens). The teacher runs on each batch
before the update (Tunix), the student inside it; per update `s` of `S`:

  loss = alpha(s) * T^2 * KL(teacher_T || student_T)
         + (1 - alpha(s)) * CE(student, labels)
         + beta(s) * mean over `feature_layers` pairs of the feature loss,

each term a mean over the masked tokens, with `_T` the softmax at
temperature T; alpha and beta go from their start to their end value over
the run ("linear" or "cosine"; "constant" keeps the start). The feature
loss compares the outputs of student block i and teacher block j for each
pair (i, j): 1 - cosine similarity, or the mean squared difference ("l2");
the widths must match. Feature capture wraps those blocks (Tunix's
`SowedModule`), runs the blocks without remat and collects what they sow
with `nnx.capture`.

Metrics: train/loss and train/distill/{kl, ce, feature, teacher_ce, alpha,
beta}; eval/loss is the student's CE.

Shapes: B batch, L length, V vocab, D embed dim.
"""

import dataclasses
import math

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tunix.distillation import distillation_trainer
from tunix.distillation import feature_extraction
from tunix.distillation import strategies

from maxtext.common import layer_pattern
from maxtext.data import pipeline
from maxtext.layers import remat
from maxtext.posttrain import base_model
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import sft
from maxtext.posttrain import tunix_hooks
from maxtext.posttrain.config import DistillConfig
from maxtext.posttrain.config import PosttrainConfig
from maxtext.trainers import train_step

STEP_KEY = "step"


def schedule_value(start: float, end: float, kind: str, step: jax.Array,
                   total_steps: int) -> jax.Array:
  """The weight at update `step` (0-based) of `total_steps`: `start` at 0,
  `end` at the last update ("linear" or "cosine"), or `start` throughout
  ("constant")."""
  if kind == "constant":
    return jnp.asarray(start, jnp.float32)
  progress = jnp.clip(jnp.asarray(step, jnp.float32) /
                      max(total_steps - 1, 1), 0.0, 1.0)
  if kind == "cosine":
    progress = 0.5 * (1.0 - jnp.cos(math.pi * progress))
  return start + (end - start) * progress


def _masked_mean(x_BL: jax.Array, mask_BL: jax.Array) -> jax.Array:
  weights_BL = mask_BL.astype(jnp.float32)
  return (x_BL * weights_BL).sum() / jnp.maximum(weights_BL.sum(), 1.0)


def kl_divergence(teacher_logits_BLV: jax.Array, student_logits_BLV: jax.Array,
                  mask_BL: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Masked mean over tokens of KL(teacher_T || student_T)."""
  log_p_BLV = jax.nn.log_softmax(
      teacher_logits_BLV.astype(jnp.float32) / temperature)
  log_q_BLV = jax.nn.log_softmax(
      student_logits_BLV.astype(jnp.float32) / temperature)
  kl_BL = (jnp.exp(log_p_BLV) * (log_p_BLV - log_q_BLV)).sum(-1)
  return _masked_mean(kl_BL, mask_BL)


def feature_loss(student_BLD: jax.Array, teacher_BLD: jax.Array,
                 mask_BL: jax.Array, kind: str) -> jax.Array:
  """Masked mean over tokens of 1 - cosine similarity ("cosine") or of the
  mean squared difference ("l2")."""
  s_BLD = student_BLD.astype(jnp.float32)
  t_BLD = teacher_BLD.astype(jnp.float32)
  if kind == "cosine":
    cosine_BL = (s_BLD * t_BLD).sum(-1) / jnp.maximum(
        jnp.linalg.norm(s_BLD, axis=-1) * jnp.linalg.norm(t_BLD, axis=-1),
        1e-8)
    per_token_BL = 1.0 - cosine_BL
  else:
    per_token_BL = jnp.square(s_BLD - t_BLD).mean(-1)
  return _masked_mean(per_token_BL, mask_BL)


def _block_slot(decoder: nnx.Module, layer: int) -> tuple[str, int]:
  """(attribute, index) of block `layer`: its kind's stack and its place
  there (`layer_pattern`)."""
  pattern = decoder.pattern
  return pattern[layer].kind.name, layer_pattern.slots(pattern)[layer]


def _capture(model: nnx.Module, layers: list[int]) -> None:
  """Wraps blocks `layers` of the adapted model so their outputs are sown."""
  for layer in layers:
    group, index = _block_slot(model.model, layer)
    blocks = getattr(model.model, group)
    blocks[index] = feature_extraction.SowedModule(blocks[index])
  model.model.execution = dataclasses.replace(model.model.execution,
                                              remat=remat.RematConfig())


def _forward_fn(layers: list[int]):
  """`forward(model, **batch) -> {"logits", "features" [N, B, L, D]}`."""

  def forward(model, inputs, positions=None, segment_ids=None, **unused):
    del unused
    if not layers:
      logits_BLV, _ = model(inputs, positions, segment_ids=segment_ids)
      return {"logits": logits_BLV}
    # The wrapped blocks sow their outputs as `nnx.Intermediate`.
    (logits_BLV, _), sown = nnx.capture(model, nnx.Intermediate)(
        inputs, positions, segment_ids=segment_ids)
    sown = nnx.to_pure_dict(sown)["model"]
    features = []
    for layer in layers:
      group, index = _block_slot(model.model, layer)
      # The sown block output: the residual stream (then cache, aux).
      value = sown[group][index][tunix_hooks.SOW_TAG][0]
      features.append(value[0] if isinstance(value, tuple) else value)
    return {"logits": logits_BLV, "features": jnp.stack(features)}

  return forward


def _labels(targets, mask, step, **unused):
  del unused
  return {"targets": targets, "mask": mask, STEP_KEY: step}


class DistillStrategy(strategies.BaseStrategy):
  """The loss of the module docstring, as a Tunix strategy."""

  def __init__(self, config: DistillConfig, total_steps: int):
    student_layers = [s for s, _ in config.feature_layers]
    teacher_layers = [t for _, t in config.feature_layers]
    super().__init__(_forward_fn(student_layers),
                     _forward_fn(teacher_layers), _labels)
    self.config = config
    self.total_steps = total_steps
    self.student_layers = student_layers
    self.teacher_layers = teacher_layers

  def pre_process_models(self, student_model, teacher_model):
    self.capture_student(student_model)
    self.capture_teacher(teacher_model)
    return student_model, teacher_model

  def capture_student(self, student_model: nnx.Module) -> None:
    """Wraps the student's `feature_layers` blocks so they sow their
    outputs (the trainer does it before making its optimizer)."""
    _capture(student_model, self.student_layers)

  def capture_teacher(self, teacher_model: nnx.Module) -> None:
    """Wraps the teacher's `feature_layers` blocks likewise."""
    _capture(teacher_model, self.teacher_layers)

  def post_process_models(self, student_model, teacher_model):
    feature_extraction.unwrap_sowed_modules(student_model)
    feature_extraction.unwrap_sowed_modules(teacher_model)
    return student_model, teacher_model

  def weights(self, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(alpha, beta) at update `step`."""
    c = self.config
    return (schedule_value(c.alpha, c.alpha_end, c.alpha_schedule, step,
                           self.total_steps),
            schedule_value(c.beta, c.beta_end, c.beta_schedule, step,
                           self.total_steps))

  def compute_loss(self, student_output, teacher_output, labels):
    mask_BL = labels["mask"]
    student_BLV = student_output["logits"]
    teacher_BLV = teacher_output["logits"]
    temperature = self.config.temperature
    kl = kl_divergence(teacher_BLV, student_BLV, mask_BL, temperature)
    ce, _ = train_step.cross_entropy(student_BLV, labels["targets"], mask_BL)
    teacher_ce, _ = train_step.cross_entropy(teacher_BLV, labels["targets"],
                                             mask_BL)
    alpha, beta = self.weights(labels[STEP_KEY])
    features = jnp.zeros((), jnp.float32)
    if self.student_layers:
      features = jnp.mean(jnp.stack([
          feature_loss(s_BLD, t_BLD, mask_BL, self.config.feature_loss)
          for s_BLD, t_BLD in zip(student_output["features"],
                                  teacher_output["features"])]))
    loss = (alpha * temperature**2 * kl + (1.0 - alpha) * ce +
            beta * features)
    return loss, {"distill/kl": kl, "distill/ce": ce,
                  "distill/feature": features, "distill/teacher_ce": teacher_ce,
                  "distill/alpha": alpha, "distill/beta": beta}

  def compute_eval_loss(self, student_output, labels):
    ce, _ = train_step.cross_entropy(student_output["logits"],
                                     labels["targets"], labels["mask"])
    return ce, {}


class _DistillTrainer(distillation_trainer.DistillationTrainer):
  """Tunix's trainer fed our packed batches: the model keys, the update
  index (for the schedules) and the teacher's outputs, logged metrics."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    # The strategy's loss itself (it returns (loss, metrics)): what
    # aot_compile compiles.
    self.loss_fn = self.strategy.get_train_loss
    self.gen_model_input_fn = lambda x: x
    self.aux_names = ("distill/kl", "distill/ce", "distill/feature",
                      "distill/teacher_ce", "distill/alpha", "distill/beta")

  def _prepare_inputs(self, input_data):
    inputs = {key: input_data[key] for key in pipeline.MODEL_KEYS}
    inputs[STEP_KEY] = np.asarray(self.train_steps, np.int32)
    teacher_output = None
    if not tunix_hooks.in_eval(self):
      teacher_output = self.strategy.get_teacher_outputs(self.teacher_model,
                                                         inputs)
    return {"inputs": inputs, "teacher_output": teacher_output}

  def _post_process_train_step(self, aux):
    for name in self.aux_names:
      tunix_hooks.buffer_train_metric(self, name, aux[name])


def _check_models(student: base_model.LoadedModel,
                  teacher: base_model.LoadedModel,
                  config: DistillConfig) -> None:
  if student.cfg.vocab_size != teacher.cfg.vocab_size:
    raise ValueError(
        f"The student's vocab_size {student.cfg.vocab_size} differs from the"
        f" teacher's {teacher.cfg.vocab_size}: distillation needs the same"
        " tokenizer.")
  for s, t in config.feature_layers:
    for name, layer, cfg in (("student", s, student.cfg),
                             ("teacher", t, teacher.cfg)):
      if not 0 <= layer < cfg.num_layers:
        raise ValueError(
            f"distill.feature_layers pair ({s}, {t}): the {name} has"
            f" {cfg.num_layers} layers (0..{cfg.num_layers - 1}).")
    if student.cfg.embed_dim != teacher.cfg.embed_dim:
      raise ValueError(
          f"distill.feature_layers: the student's width"
          f" {student.cfg.embed_dim} differs from the teacher's"
          f" {teacher.cfg.embed_dim}; feature losses need equal widths.")


def run_distill(config: PosttrainConfig,
                workdir: str) -> runtime_lib.RunResult:
  """Distils `distill.teacher` into `train.load` on `config.data`."""
  runtime = runtime_lib.make_runtime(config)
  data = sft.data_config(config, workdir)
  rows = config.train.rows
  student = base_model.load_model(config.train.load, lora=config.lora,
                                  seed=config.train.seed, rules=runtime.rules,
                                  execution=config.execution)
  teacher = base_model.load_model(config.distill.teacher,
                                  quantize=config.distill.teacher_qtype,
                                  rules=runtime.rules,
                                  execution=config.execution)
  _check_models(student, teacher, config.distill)
  train_data = pipeline.make_train_pipeline(
      data, batch_size=rows, vocab_size=student.cfg.vocab_size)
  eval_data = (sft.EvalBatches(data, rows, student.cfg.vocab_size)
               if data.eval_every_steps else None)
  with runtime.activate():
    trainer = _DistillTrainer(
        student.model, teacher.model,
        DistillStrategy(config.distill, config.train.steps),
        runtime_lib.make_optimizer(config),
        runtime_lib.training_config(config, workdir, runtime, data.seq_len,
                                    cls=distillation_trainer.TrainingConfig))
    tunix_hooks.run_our_step(trainer, has_aux=True)
    try:
      preempted = runtime_lib.train_until_stopped(
          trainer, sft.model_batches(train_data), eval_data,
          every=config.train.microbatches)
    finally:
      train_data.close()
  return runtime_lib.finish(config, workdir, student, trainer,
                            preempted=preempted)


def run(config: ml_collections.ConfigDict,
        workdir: str) -> runtime_lib.RunResult:
  """Runs the distillation `config` in `workdir`.

  Raises:
    ValueError: the config is invalid (names the key) or its method is not
      "distill".
  """
  posttrain, workdir = runtime_lib.start(config, workdir)
  if posttrain.train.method != "distill":
    raise ValueError(f"train.method={posttrain.train.method!r} is run by"
                     " //maxtext/bin:sft; //maxtext/bin:distill runs"
                     " 'distill' (configs/distill.py).")
  return run_distill(posttrain, workdir)
