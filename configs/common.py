"""Defaults shared by every model family's config.

A family config (`configs/<family>.py`) calls `family_config()`, which starts
from `base_config()` and applies what the family and the chosen variant change.
Sections, in this order: model, data, optimizer, train, mesh, sharding,
checkpoint, logging.

This module is data: importing it has no side effects.
"""

import ml_collections


def model_defaults() -> ml_collections.ConfigDict:
  """Every field of `maxtext.common.model_config.ModelConfig`.

  The values are those of a plain pre-norm decoder (the dataclass's defaults);
  the shape fields are left for the family config to set. Listing every field
  lets any of them be overridden from the command line.
  """
  return ml_collections.ConfigDict(dict(
      family="",
      vocab_size=0,
      num_layers=0,
      embed_dim=0,
      mlp_dim=0,
      num_heads=0,
      num_kv_heads=0,
      head_dim=0,
      tie_embeddings=True,
      dtype="float32",
      param_dtype="float32",
      scan_layers=True,
      attention_impl="reference",
      norm_eps=1e-6,
      norm_offset=0.0,
      post_norms=False,
      qk_norm=False,
      qkv_bias=False,
      scale_embeddings=False,
      rope_theta=10_000.0,
      rope_local_theta=10_000.0,
      rope_scaling="default",
      rope_scaling_factor=1.0,
      rope_low_freq_factor=1.0,
      rope_high_freq_factor=4.0,
      rope_original_max_length=8192,
      sliding_window=0,
      global_layer_interval=1,
      # None: queries are scaled by head_dim**-0.5.
      query_pre_attn_scalar=ml_collections.FieldReference(None, float),
      attn_logit_softcap=0.0,
      final_logit_softcap=0.0,
      mlp_activation="silu",
      # Recomputation in the backward pass of each block: "none", "full",
      # "minimal", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj" or
      # "nothing_saveable" (maxtext.layers.remat).
      remat_policy="none",
  ))


def family_config(family: str, arg: str | None,
                  variants: dict[str, dict[str, object]],
                  **family_fields) -> ml_collections.ConfigDict:
  """The config of one variant of a model family.

  Args:
    family: The family's name (`ModelConfig.family`).
    arg: The variant, from `--config=configs/<family>.py:<variant>`; None
      means "small", the default that trains on a CPU in a few minutes.
    variants: Model fields of each variant.
    **family_fields: Model fields the whole family sets, applied before the
      variant's.

  Raises:
    ValueError: `arg` is not a variant; the message lists the valid ones.
  """
  variant = arg or "small"
  if variant not in variants:
    raise ValueError(f"Unknown {family} variant {variant!r}; valid variants: "
                     f"{sorted(variants)}.")
  config = base_config()
  config.model.family = family
  # Published sizes compute in bfloat16; the small CPU models in float32.
  config.model.dtype = "float32" if variant == "small" else "bfloat16"
  config.model.update(family_fields)
  config.model.update(variants[variant])
  return config


MESH_AXES = ("data", "fsdp", "fsdp_transpose", "sequence", "tensor", "expert",
             "stage")


def mesh_axes(**sizes: int) -> ml_collections.ConfigDict:
  """Size of every mesh axis (1 unless given)."""
  return ml_collections.ConfigDict(
      {name: sizes.get(name, 1) for name in MESH_AXES})


# The parameter layout: (logical axis, mesh axes) pairs, first fit per
# dimension (maxtext.sharding.rules): a rule is skipped when one of its mesh
# axes already shards another dimension of the same array or the product of
# its sizes does not divide the dimension; then the next rule of that name is
# tried, and a name without a fitting rule is replicated. Mesh axes of size 1
# are ignored.
#   vocab     embedding rows / output head columns: tensor parallel.
#   embed     model dim of every kernel: FSDP over fsdp, sequence and
#             expert (they all split the batch, so they share the parameters'
#             memory); fsdp alone if that does not fit.
#   mlp       MLP hidden: tensor, then fsdp_transpose.
#   heads, kv_heads: tensor parallel (kv_heads falls back to replicated when
#             there are fewer key/value heads than tensor devices).
#   head_dim  replicated. layers: replicated (a stage axis would go here).
PARAM_RULES = (
    ("vocab", ("tensor",)),
    ("embed", ("fsdp", "sequence", "expert")),
    ("embed", ("fsdp",)),
    ("mlp", ("tensor", "fsdp_transpose")),
    ("mlp", ("tensor",)),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("head_dim", ()),
    ("layers", ()),
)

# The compute layout of activations, same semantics.
#   batch     every data-like axis.
#   length    the sequence axis (queries; keys and values, "kv_length", are
#             gathered whole, so attention sees every key).
#   embed     the residual stream is replicated over tensor.
#   heads, kv_heads, mlp, vocab: tensor parallel.
COMPUTE_RULES = (
    ("batch", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("length", ("sequence",)),
    ("kv_length", ()),
    ("embed", ()),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("head_dim", ()),
    ("mlp", ("tensor",)),
    ("vocab", ("tensor",)),
)


def sharding_defaults() -> ml_collections.ConfigDict:
  """The `sharding` section: the parameter and compute rule tables."""
  return ml_collections.ConfigDict(dict(param_rules=PARAM_RULES,
                                        compute_rules=COMPUTE_RULES))


def base_config() -> ml_collections.ConfigDict:
  """Returns the defaults of every section."""
  config = ml_collections.ConfigDict()

  config.model = model_defaults()

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
  # Gradient accumulation: each update runs the batch in this many slices.
  config.train.microbatches = 1

  config.mesh = ml_collections.ConfigDict()
  # Devices per mesh axis within a slice (ici) and slices per axis (dcn); the
  # mesh axis is their product. -1 takes the rest, at most once per kind.
  # data: data parallel; fsdp, fsdp_transpose: parameters sharded too;
  # sequence: activations split along length; tensor: heads/MLP/vocab split;
  # expert: one more batch axis until MoE lands; stage: pipeline (not
  # implemented, must be 1). E.g. 8 devices as 2x2x2 fsdp/tensor/sequence:
  #   --config.mesh.ici.data=1 --config.mesh.ici.fsdp=2
  #   --config.mesh.ici.tensor=2 --config.mesh.ici.sequence=2
  config.mesh.ici = mesh_axes(data=-1)
  config.mesh.dcn = mesh_axes()

  config.sharding = sharding_defaults()

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
