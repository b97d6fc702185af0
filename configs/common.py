"""Defaults shared by every model family's config.

A family config (`configs/<family>.py`) starts from `base_config()`, fills the
`model` section and overrides what differs. Sections, in this order:
model, data, optimizer, train, mesh, checkpoint, logging.

This module is data: importing it has no side effects.
"""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  """Returns the defaults for every section except `model`."""
  config = ml_collections.ConfigDict()

  # Filled by the family config; its keys are the fields of
  # `maxtext.common.model_config.ModelConfig`.
  config.model = ml_collections.ConfigDict()

  config.data = ml_collections.ConfigDict()
  # 'text' reads plain-text files and tokenizes them; 'synthetic' makes
  # random tokens (for benchmarks).
  config.data.source = "text"
  # Glob patterns of UTF-8 text files. Empty means the bundled Shakespeare.
  config.data.text_files = ""
  # SentencePiece `.model` or Hugging Face `tokenizer.json`. Empty means the
  # bundled Mistral v1 SentencePiece tokenizer.
  config.data.tokenizer = ""
  # Sized with train.batch_size so that the default small models train on a
  # 2-core CPU in a few minutes; real runs override both.
  config.data.seq_len = 128
  config.data.shuffle_seed = 0

  config.optimizer = ml_collections.ConfigDict()
  # Peak learning rate, reached after warmup_steps updates; then cosine decay
  # to end_learning_rate_ratio * learning_rate at update decay_steps.
  config.optimizer.learning_rate = 1e-3
  config.optimizer.warmup_steps = 15
  config.optimizer.decay_steps = -1  # -1: decay over all of train.steps.
  config.optimizer.end_learning_rate_ratio = 0.1
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.95
  config.optimizer.eps = 1e-8
  # Decoupled; applies to matmul kernels and embeddings, not norm scales.
  config.optimizer.weight_decay = 0.1
  config.optimizer.grad_clip_norm = 1.0  # 0 turns clipping off.
  # Weight of the z-loss log(Z)^2 added to the cross-entropy; 0 is off.
  config.optimizer.z_loss = 0.0

  config.train = ml_collections.ConfigDict()
  config.train.steps = 150  # Total updates.
  config.train.batch_size = 8  # Global, in sequences.
  config.train.seed = 0  # Parameter initialisation.

  config.mesh = ml_collections.ConfigDict()
  # Devices per mesh axis; -1 takes the rest. Parameters are replicated for
  # now, so fsdp and tensor must be 1.
  config.mesh.data = -1
  config.mesh.fsdp = 1
  config.mesh.tensor = 1

  config.checkpoint = ml_collections.ConfigDict()
  # Saved in <workdir>/checkpoints every every_steps updates and at the end;
  # a rerun with the same workdir resumes from the latest.
  config.checkpoint.every_steps = 50
  config.checkpoint.max_to_keep = 3
  config.checkpoint.async_save = True

  config.logging = ml_collections.ConfigDict()
  # Metrics go to the log, <workdir>/metrics.jsonl and, with tensorboard,
  # <workdir>/tensorboard.
  config.logging.every_steps = 10
  config.logging.tensorboard = True
  # Peak FLOP/s per device for MFU; 0 means look it up by device kind.
  config.logging.peak_flops_per_device = 0.0
  # Profile steps [profile_start_step, profile_start_step + profile_steps).
  config.logging.profile_start_step = -1
  config.logging.profile_steps = 3

  return config
