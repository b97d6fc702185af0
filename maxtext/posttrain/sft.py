"""Supervised fine-tuning on Tunix's `PeftTrainer`: full, LoRA or QLoRA.

`run(config, workdir)` is what `//maxtext/bin:sft` runs; it dispatches on
`train.method`: "sft" here, "dpo"/"orpo" to `maxtext.posttrain.dpo`.

SFT data comes from our pipeline (`maxtext.data.pipeline`): chat records
(`messages` in `data.text_field`, JSONL/Parquet/Arrow/ArrayRecord) rendered
by `data.chat_template` with loss weight on the assistant turns only, packed
(`data.packing`) into rows with segment ids and positions, and an eval split
(`data.eval_files` every `data.eval_every_steps` updates). Records with a
prompt and a completion column (`sft.prompt_field`, `sft.completion_field`)
are first written as conversations (a user turn and an assistant turn) to
<workdir>/sft_data/ and read from there.

The loss is the masked mean next-token cross-entropy of
`maxtext.trainers.train_step.cross_entropy` over the rows' `mask` (1 on
assistant tokens of the same segment). With `train.microbatches = M`, each
update averages the gradients of M slices of `batch_size / M` rows (Tunix's
`optax.MultiSteps`): the mean of the slices' masked means, which equals the
whole batch's mean when the slices hold as many target tokens.

Only the adapters train under LoRA/QLoRA (`lora.mode`); every parameter
under "full", except a vision-language model's vision tower unless
`sft.train_vision` (its projector trains). Such a model reads the images
of the records' image parts (`data.images_per_row` slots per row,
preprocessed as its checkpoint's `preprocessor_config.json` says;
`maxtext.data.images`). The run ends by exporting the model (`maxtext.posttrain
.base_model.export`): adapters merged into the base weights.

Shapes: B batch, L length, V vocab.
"""

from collections.abc import Iterator, Sequence
import dataclasses
import json
import os

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from tunix.sft import peft_trainer

from maxtext.common.model_config import ModelConfig
from maxtext.data import images as images_lib
from maxtext.data import packing
from maxtext.data import pipeline
from maxtext.data.data_config import DataConfig
from maxtext.metrics import flops
from maxtext.models import registry
from maxtext.posttrain import base_model
from maxtext.posttrain import compiled_step
from maxtext.posttrain import dpo
from maxtext.posttrain import rows as rows_lib
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import tunix_hooks
from maxtext.posttrain.config import PosttrainConfig
from maxtext.trainers import hooks
from maxtext.trainers import train_step

SFT_DATA_DIRNAME = "sft_data"
MESSAGES_FIELD = "messages"


def sft_loss(model, inputs: jax.Array, targets: jax.Array, mask: jax.Array,
             segment_ids: jax.Array | None = None,
             positions: jax.Array | None = None,
             images: jax.Array | None = None) -> jax.Array:
  """Masked mean cross-entropy of the adapted `model` on one batch [B, L]
  (with its `images` [B, v, h, w, 3], a vision-language model)."""
  logits_BLV, _ = model(inputs, positions, segment_ids=segment_ids,
                        images=images)
  loss, _ = train_step.cross_entropy(logits_BLV, targets, mask)
  return loss


def _write_conversations(kind: str, files: str, prompt_field: str,
                         completion_field: str, path: str) -> int:
  """Writes prompt/completion records as JSONL conversations; returns the
  number of records."""
  count = 0
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    for row in rows_lib.read_rows(kind, files, (prompt_field,
                                                completion_field)):
      messages = [{"role": "user", "content": row[prompt_field]},
                  {"role": "assistant", "content": row[completion_field]}]
      f.write(json.dumps({MESSAGES_FIELD: messages}, ensure_ascii=False))
      f.write("\n")
      count += 1
  os.replace(path + ".tmp", path)
  return count


def data_config(config: PosttrainConfig,
                workdir: str) -> DataConfig:
  """The data section the pipeline reads: `config.data`, or with
  prompt/completion records, conversations written to the workdir.

  Raises:
    ValueError: no chat template is set, or the data source is a mixture
      or synthetic with prompt/completion fields.
  """
  data = config.data
  if not data.chat_template:
    raise ValueError("SFT needs data.chat_template (e.g. 'chatml', a .jinja"
                     " file or a tokenizer_config.json): the loss counts the"
                     " assistant turns it marks.")
  sft = config.sft
  if not sft.prompt_field:
    return data
  if data.source not in ("jsonl", "parquet", "arrayrecord", "arrow"):
    raise ValueError(
        f"sft.prompt_field needs a file source with named fields, not"
        f" data.source={data.source!r}.")
  folder = os.path.join(workdir, SFT_DATA_DIRNAME)
  changes = dict(source="jsonl", text_field=MESSAGES_FIELD,
                 files=os.path.join(folder, "train.jsonl"))
  count = _write_conversations(data.source, data.files, sft.prompt_field,
                               sft.completion_field, changes["files"])
  logging.info("Wrote %d prompt/completion records as conversations to %s.",
               count, changes["files"])
  if data.eval_files:
    changes.update(eval_source="jsonl",
                   eval_files=os.path.join(folder, "eval.jsonl"))
    _write_conversations(data.eval_kind(), data.eval_files, sft.prompt_field,
                         sft.completion_field, changes["eval_files"])
  # `mixture` is stored as (name, component) pairs; replace wants a mapping.
  return dataclasses.replace(data, mixture=dict(data.mixture), **changes)


def model_batches(batches, keys: Sequence[str] = pipeline.MODEL_KEYS
                  ) -> Iterator[dict[str, np.ndarray]]:
  for batch in batches:
    yield {key: batch[key] for key in keys}


class EvalBatches:
  """The eval split, read afresh by each evaluation."""

  def __init__(self, data: DataConfig, rows: int, vocab_size: int,
               image_inputs: images_lib.ImageInputs | None = None):
    self.data = data
    self.rows = rows
    self.vocab_size = vocab_size
    self.image_inputs = image_inputs

  def __iter__(self):
    return model_batches(pipeline.eval_batches(
        self.data, batch_size=self.rows, vocab_size=self.vocab_size,
        image_inputs=self.image_inputs), pipeline.model_keys(self.data))


def batch_specs(config: PosttrainConfig, cfg: ModelConfig
                ) -> dict[str, jax.ShapeDtypeStruct]:
  """One training batch of `config` for model `cfg`, as shapes and dtypes
  by key (its images at the tower's size with `data.images_per_row`).

  Raises:
    ValueError: images are asked of a model without a vision tower.
  """
  rows, seq_len = config.train.rows, config.data.seq_len
  per_row = config.data.images_per_row
  _check_tower(per_row, cfg, config.train.load)
  specs = {}
  for key in pipeline.model_keys(config.data):
    if key == packing.IMAGES:
      side = cfg.vision.image_size
      specs[key] = jax.ShapeDtypeStruct((rows, per_row, side, side, 3),
                                        jnp.float32)
    else:
      specs[key] = jax.ShapeDtypeStruct((rows, seq_len), jnp.int32)
  return specs


def image_inputs(loaded: base_model.LoadedModel,
                 data: DataConfig) -> images_lib.ImageInputs | None:
  """What the pipeline needs to read images for the loaded model (None
  without `data.images_per_row`).

  Raises:
    ValueError: images are asked of a model without a vision tower.
  """
  if not data.images_per_row:
    return None
  _check_tower(data.images_per_row, loaded.cfg, loaded.path)
  return registry.image_inputs(loaded.cfg, loaded.path)


def _check_tower(images_per_row: int, cfg: ModelConfig, path: str) -> None:
  """ValueError when images are asked of `cfg` (of checkpoint `path`),
  which has no vision tower."""
  if images_per_row and not cfg.vision.layers:
    raise ValueError(
        f"data.images_per_row={images_per_row} needs a model with a vision"
        f" tower; the {cfg.family} model of {path} has none"
        " (vision_layers=0).")


def throughput(config: PosttrainConfig, cfg: ModelConfig, data: DataConfig,
               num_devices: int) -> hooks.Throughput:
  """What turns sft's step time into tokens/s and MFU: the training FLOPs of
  a step's tokens and, for a vision-language model, of its image slots in
  the tower (`flops.vision_flops_per_image`), per token."""
  rows = config.train.batch_size
  tokens = rows * data.seq_len
  return hooks.Throughput(
      tokens_per_step=tokens, num_devices=num_devices,
      flops_per_token=(flops.training_flops_per_token(cfg, data.seq_len) +
                       image_flops(config, cfg, rows) / tokens),
      peak_flops_per_device=flops.peak_flops_per_device())


def image_flops(config: PosttrainConfig, cfg: ModelConfig,
                rows: int) -> float:
  """FLOPs of `rows` rows' image slots (`data.images_per_row` each) in
  `cfg`'s vision tower, forward only when the run keeps it frozen (0
  without slots)."""
  return rows * config.data.images_per_row * flops.vision_flops_per_image(
      cfg, trained=trains_vision(config, cfg))


def trains_vision(config: PosttrainConfig, cfg: ModelConfig) -> bool:
  """Whether the run trains `cfg`'s vision tower (full fine-tuning with
  `sft.train_vision`)."""
  return bool(cfg.vision.layers and config.lora.mode == "full" and
              config.sft.train_vision)


def make_optimizer(config: PosttrainConfig,
                   cfg: ModelConfig) -> optax.GradientTransformation:
  """The optimizer sft trains `cfg` with: the run's, the vision tower
  frozen where the run fully fine-tunes a tower it does not train."""
  optimizer = runtime_lib.make_optimizer(config)
  if (cfg.vision.layers and config.lora.mode == "full" and
      not config.sft.train_vision):
    optimizer = frozen_vision(optimizer)
  return optimizer


def frozen_vision(optimizer: optax.GradientTransformation
                  ) -> optax.GradientTransformation:
  """`optimizer` that leaves the vision tower's parameters (those under a
  `vision` module) as they are: their gradients are zeroed before it (its
  moments stay zero) and their updates after it (no weight decay). Its
  state keeps the whole parameter tree, so a run resumes from its
  checkpoints like any other."""

  def zero_vision(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda path, update: jnp.zeros_like(update) if any(
            getattr(key, "key", getattr(key, "name", None)) == "vision"
            for key in path) else update, updates), state

  frozen = optax.GradientTransformation(lambda params: optax.EmptyState(),
                                        zero_vision)
  return optax.chain(frozen, optimizer, frozen)


def make_trainer(config: PosttrainConfig, loaded: base_model.LoadedModel,
                 runtime: runtime_lib.Runtime, workdir: str,
                 data: DataConfig) -> peft_trainer.PeftTrainer:
  """The sft trainer of `loaded` (call it within the run's mesh): Tunix's
  `PeftTrainer` on `sft_loss`, running our step (`tunix_hooks`), the one
  saved in `train.compiled` if set.

  Raises:
    saved_step.MismatchError: `train.compiled` was compiled for another
      run (names each difference).
    OSError: `train.compiled` is not a saved step.
  """
  trainer = peft_trainer.PeftTrainer(
      loaded.model, make_optimizer(config, loaded.cfg),
      runtime_lib.training_config(
          config, workdir, runtime, data.seq_len,
          throughput=throughput(config, loaded.cfg, data, runtime.mesh.size)))
  trainer.with_loss_fn(sft_loss)
  tunix_hooks.run_our_step(trainer, has_aux=False)
  if config.train.compiled:
    batch = compiled_step.tunix_layout(
        batch_specs(config, loaded.cfg), runtime.mesh,
        runtime.data_axes(config.train.rows, data.seq_len))
    try:
      loaded_step = compiled_step.load(config.train.compiled, config,
                                       loaded.cfg, trainer, runtime.mesh,
                                       batch)
    except BaseException:  # Its metrics files closed, then re-raised.
      trainer.close()
      raise
    tunix_hooks.run_compiled_step(trainer, loaded_step)
  return trainer


def run_sft(config: PosttrainConfig,
            workdir: str) -> runtime_lib.RunResult:
  """Fine-tunes `train.load` on `config.data`."""
  runtime = runtime_lib.make_runtime(config)
  data = data_config(config, workdir)
  rows = config.train.rows
  loaded = base_model.load_model(config.train.load, lora=config.lora,
                                 seed=config.train.seed, rules=runtime.rules,
                                 execution=config.execution)
  vocab_size = loaded.cfg.vocab_size
  images = image_inputs(loaded, data)
  with runtime.activate():
    train_data = pipeline.make_train_pipeline(
        data, batch_size=rows, vocab_size=vocab_size, image_inputs=images)
    trainer = make_trainer(config, loaded, runtime, workdir, data)
    eval_data = (EvalBatches(data, rows, vocab_size, images)
                 if data.eval_every_steps else None)
    try:
      preempted = runtime_lib.train_until_stopped(
          trainer, model_batches(train_data, pipeline.model_keys(data)),
          eval_data, every=config.train.microbatches)
    finally:
      train_data.close()
  return runtime_lib.finish(config, workdir, loaded, trainer,
                            preempted=preempted)


def run(config: ml_collections.ConfigDict,
        workdir: str) -> runtime_lib.RunResult:
  """Runs `train.method` "sft", "dpo" or "orpo" of `config` in `workdir`.

  Raises:
    ValueError: the config is invalid (names the key), or its method is
      "distill" (//maxtext/bin:distill runs that).
  """
  posttrain, workdir = runtime_lib.start(config, workdir)
  method = posttrain.train.method
  if method == "sft":
    return run_sft(posttrain, workdir)
  if method in ("dpo", "orpo"):
    return dpo.run_dpo(posttrain, workdir)
  raise ValueError(f"train.method={method!r} is run by //maxtext/bin:distill,"
                   " not sft.")
