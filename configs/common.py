"""Defaults shared by every model family's config.

A family config (`configs/<family>.py`) calls `family_config()`, which starts
from `base_config()` and applies what the family and the chosen variant change.
Sections, in this order: model, qat, data, optimizer, train, mesh, sharding,
checkpoint, logging.

This module is data: importing it has no side effects.
"""

import ml_collections

from maxtext.models import registry


def model_defaults() -> ml_collections.ConfigDict:
  """Every key of the flat `model` section
  (`maxtext.common.model_config.ModelConfig.keys()`).

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
      norm_eps=1e-6,
      norm_offset=0.0,
      pre_norms=True,
      post_norms=False,
      qk_norm=False,
      qk_norm_over="head",
      qkv_bias=False,
      attention_output_bias=False,
      attention_sinks=False,  # A learned sink logit per head (GPT-OSS).
      scale_embeddings=False,
      rope_theta=10_000.0,
      # None: local layers use the global layers' rotary (GPT-OSS).
      rope_local_theta=10_000.0,
      rope_scaling="default",
      rope_scaling_factor=1.0,
      rope_low_freq_factor=1.0,
      rope_high_freq_factor=4.0,
      rope_original_max_length=8192,
      # rope_scaling="yarn" (maxtext.layers.rope).
      rope_yarn_beta_fast=32.0,
      rope_yarn_beta_slow=1.0,
      rope_yarn_truncate=True,
      rope_yarn_mscale=0.0,
      rope_yarn_mscale_all_dim=0.0,
      rope_interleaved=False,  # Pairs (2i, 2i + 1) rotate (Llama 4).
      rope_global_nope=False,  # Global layers without rotary (Llama 4).
      sliding_window=0,
      # Local layers attend within chunks of positions (Llama 4); 0: off.
      attention_chunk_size=0,
      global_layer_interval=1,
      global_head_dim=0,  # A global layer's own head size (0: head_dim).
      global_num_kv_heads=0,  # Its own kv heads (0: num_kv_heads).
      # Gemma 4: no value projection (values = the keys' projection) on all
      # or only global layers; a weightless RMS norm of the values.
      attention_k_eq_v=False,
      attention_global_k_eq_v=False,
      attention_value_norm=False,
      # Global layers rotate this fraction of their pairs (Gemma 4).
      rope_global_fraction=1.0,
      # Only this fraction of each head's dimensions rotates, as a narrower
      # head (Qwen3-Next, Qwen3.5).
      rope_partial_factor=1.0,
      # The attention output times sigmoid of a gate projection (Qwen3-Next).
      attention_output_gate=False,
      layer_scalar=False,  # A learned scalar multiplies each block's output.
      # Gemma 4 e2b/e4b: each layer's own input of this width, from a second
      # token embedding (0: off); the last kv_shared_layers layers attend
      # over an earlier layer's keys and values, with an MLP of
      # mlp_kv_shared_dim (0: mlp_dim).
      per_layer_input_dim=0,
      kv_shared_layers=0,
      mlp_kv_shared_dim=0,
      # Vision-language models (maxtext.layers.vision): a SigLIP tower of
      # vision_layers (0: none) over square images of vision_image_size
      # pixels in patches of vision_patch_size, pooled to
      # mm_tokens_per_image soft tokens at the image_token_id placeholders
      # (the chat template puts image_start_id / image_end_id around them).
      vision_layers=0,
      vision_embed_dim=0,
      vision_mlp_dim=0,
      vision_heads=0,
      vision_patch_size=14,
      vision_image_size=896,
      vision_norm_eps=1e-6,
      vision_activation="gelu_tanh",
      mm_tokens_per_image=256,
      image_token_id=0,
      image_start_id=0,
      image_end_id=0,
      # "siglip" (Gemma 3) or "llama4" (its tower: a class token, 2-D
      # rotary; pixel shuffle and an adapter of vision_adapter_dim).
      vision_arch="siglip",
      vision_adapter_dim=0,
      vision_rope_theta=10_000.0,
      # None: queries are scaled by head_dim**-0.5.
      query_pre_attn_scalar=ml_collections.FieldReference(None, float),
      attn_logit_softcap=0.0,
      # Llama 4: weightless q/k RMS norm after rotary; the queries of layers
      # without rotary scaled up with the position (0: off).
      qk_l2_norm=False,
      attn_temperature_scale=0.0,
      attn_temperature_floor_scale=8192,
      final_logit_softcap=0.0,
      mlp_activation="silu",
      # Mixture of experts (maxtext.layers.moe); num_experts=0: dense MLPs.
      num_experts=0,
      num_experts_per_token=1,
      moe_mlp_dim=0,  # Hidden width of one (routed or shared) expert.
      num_shared_experts=0,
      # The shared experts' width if not num_shared_experts * moe_mlp_dim
      # (0), and a sigmoid gate on their output (Qwen3-Next).
      shared_expert_mlp_dim=0,
      shared_expert_gate=False,
      first_dense_layers=0,  # Leading layers with a dense MLP of mlp_dim.
      moe_layer_interval=1,  # Then experts in every this-many-th layer.
      router_score="softmax",  # Or "sigmoid" (DeepSeek-V3).
      router_normalize=True,  # Chosen weights divided by their sum.
      router_bias=False,  # DeepSeek's selection bias (no gradient).
      # Moves router_bias against each step's expert loads (DeepSeek's
      # auxiliary-loss-free balancing; their 0.001); 0 is off.
      router_bias_update_rate=0.0,
      router_logit_bias=False,  # A trained bias on the logits (GPT-OSS).
      expert_bias=False,  # Biases on the experts' projections (GPT-OSS).
      expert_gate_up_fused=False,  # One gate_up parameter (GPT-OSS).
      routed_scaling_factor=1.0,
      # The routing weights scale the experts' inputs (Llama 4).
      router_weights_on_input=False,
      # Gemma 4: the router normalises the residual stream with a scale of
      # its own, and scales each chosen weight by its expert's scale.
      router_input_norm=False,
      router_per_expert_scale=False,
      # Expert layers keep the dense MLP next to the experts (Gemma 4).
      moe_with_mlp=False,
      num_expert_groups=1,  # Group-limited routing (DeepSeek); 1: off.
      expert_groups_per_token=1,
      # A group's score: "top2_sum" (DeepSeek-V3) or "max" (DeepSeek-V2).
      expert_group_score="top2_sum",
      # "dropless" (ragged_dot), "capacity" (drops past capacity_factor) or
      # "dense" (every expert on every token: the reference).
      moe_impl="dropless",
      capacity_factor=1.25,
      # With expert parallelism, how the dropless path moves tokens:
      # "all_to_all", "all_gather" or "auto" (maxtext.layers.moe).
      moe_expert_exchange="auto",
      # The "all_gather" exchange's tokens through the experts in this many
      # rematerialised chunks: less memory, one more expert forward pass.
      moe_expert_chunks=1,
      load_balance_loss_weight=0.0,  # Auxiliary load-balancing loss.
      router_z_loss_weight=0.0,
      # "gqa" or "mla" (DeepSeek's multi-head latent attention, whose
      # head_dim is the rotary part's width; maxtext.layers.mla).
      attention_type="gqa",
      q_lora_rank=0,  # MLA: low-rank queries; 0: one full projection.
      kv_lora_rank=0,  # MLA: width of the cached key/value latent.
      qk_nope_head_dim=0,  # MLA: non-rotary part of query/key heads.
      v_head_dim=0,  # MLA: value head width.
      rope_interleave=False,  # MLA: rotary pairs (0, 1), (2, 3), ...
      # MLA: DeepSeek Sparse Attention (DeepSeek-V3.2), each query attends
      # to the index_topk tokens its indexer scores highest; 0: dense.
      index_topk=0,
      index_num_heads=0,
      index_head_dim=0,
      # How the indexer trains: "sparse", or "warmup" (dense attention,
      # only the indexer trains; then continue with "sparse").
      index_stage="sparse",
      # Multi-token prediction depths (DeepSeek-V3; maxtext.models.mtp).
      mtp_layers=0,
      mtp_loss_weight=0.0,
      # Gated DeltaNet layers (maxtext.layers.gated_deltanet; Qwen3-Next,
      # Qwen3.5), 0 key heads: none. Layer i is full attention when
      # (i + 1) % full_attention_interval == 0 (0: every layer linear).
      linear_num_key_heads=0,
      linear_num_value_heads=0,
      linear_key_head_dim=128,
      linear_value_head_dim=128,
      linear_conv_taps=4,
      full_attention_interval=4,
  ))


def family_architecture(family: str, name: str) -> dict[str, object]:
  """Model fields `maxtext/models/<family>.py` fixes under `name` for some
  variants only (Gemma 4's MOE_ARCHITECTURE: its MoE block)."""
  return dict(getattr(registry.family_module(family), name))


def family_config(family: str, arg: str | None,
                  variants: dict[str, dict[str, object]],
                  **family_fields) -> ml_collections.ConfigDict:
  """The config of one variant of a model family.

  Args:
    family: The family's name (`ModelConfig.family`).
    arg: The variant, from `--config=configs/<family>.py:<variant>`; None
      means "small", the default that trains on a CPU in a few minutes.
    variants: Model fields of each variant (sizes).
    **family_fields: Model fields the variants share (sizes), applied
      before the variant's.

  The family's architecture (`ARCHITECTURE` of `maxtext/models/<family>.py`)
  is applied first; neither `family_fields` nor a variant may restate it.

  Raises:
    ValueError: `arg` is not a variant (the message lists the valid ones),
      or a size restates an architecture field.
  """
  variant = arg or "small"
  if variant not in variants:
    raise ValueError(f"Unknown {family} variant {variant!r}; valid variants: "
                     f"{sorted(variants)}.")
  architecture = registry.family_module(family).ARCHITECTURE
  restated = sorted(set(architecture) & (set(family_fields) |
                                         set(variants[variant])))
  if restated:
    raise ValueError(f"configs/{family}.py restates {restated}, the"
                     f" architecture of maxtext/models/{family}.py.")
  config = base_config()
  config.model.family = family
  # Published sizes compute in bfloat16; the small CPU models in float32.
  config.model.dtype = "float32" if variant == "small" else "bfloat16"
  config.model.update(architecture)
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
#   heads, kv_heads, index_heads (DeepSeek Sparse Attention's indexer):
#             tensor parallel (kv_heads falls back to replicated when there
#             are fewer key/value heads than tensor devices).
#   head_dim  replicated.
#   layers    the stacked layers of scan_layers: split into pipeline stages.
#   experts   the expert dim of expert weights: expert parallel (their embed
#             dim then falls back to fsdp alone).
PARAM_RULES = (
    ("vocab", ("tensor",)),
    ("experts", ("expert",)),
    ("embed", ("fsdp", "sequence", "expert")),
    ("embed", ("fsdp",)),
    ("mlp", ("tensor", "fsdp_transpose")),
    ("mlp", ("tensor",)),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("index_heads", ("tensor",)),
    ("head_dim", ()),
    ("layers", ("stage",)),
)

# The compute layout of activations, same semantics.
#   batch     every data-like axis.
#   length    the sequence axis (queries; keys and values, "kv_length", are
#             gathered whole, so attention sees every key).
#   embed     the residual stream is replicated over tensor.
#   heads, kv_heads, index_heads, mlp, vocab: tensor parallel.
#   stage     the pipeline's buffer of one microbatch per stage.
#   experts   tokens dispatched to experts (capacity path): each expert's
#             slots live with its weights, so dispatch is an all-to-all.
COMPUTE_RULES = (
    ("batch", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("experts", ("expert",)),
    ("length", ("sequence",)),
    ("kv_length", ()),
    ("embed", ()),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("index_heads", ("tensor",)),
    ("head_dim", ()),
    ("mlp", ("tensor",)),
    ("vocab", ("tensor",)),
    ("stage", ("stage",)),
)


def sharding_defaults() -> ml_collections.ConfigDict:
  """The `sharding` section: the rule tables and optimizer-state layout."""
  return ml_collections.ConfigDict(dict(
      param_rules=PARAM_RULES,
      compute_rules=COMPUTE_RULES,
      # ZeRO-1: the optimizer state is also split over the `data` axis.
      zero1=False,
      # Keep the optimizer state in host memory ("pinned_host") between
      # steps; an error on backends without it.
      offload_optimizer_state=False,
  ))


def base_config() -> ml_collections.ConfigDict:
  """Returns the defaults of every section."""
  config = ml_collections.ConfigDict()

  config.model = model_defaults()

  # Quantization-aware training with qwix (maxtext.quant.qat): the matmuls
  # of modules whose path fully matches module_path (e.g.
  # "blocks/attention/query", "blocks/3/mlp/up", "head") run on weights and
  # activations fake-quantized to qtype, "none" (off), "int8" or "fp8"
  # (e4m3), with straight-through gradients; parameters, optimizer state and
  # checkpoints stay as they are. E.g. --config.qat.qtype=int8.
  config.qat = ml_collections.ConfigDict(dict(
      qtype="none",
      module_path=r".*(attention|mlp).*",
  ))

  config.data = ml_collections.ConfigDict()
  # Where records come from: 'text' (plain text files), 'jsonl', 'parquet',
  # 'arrayrecord' (records of JSON objects), 'arrow' (Hugging Face datasets
  # saved with save_to_disk; files are its folders), 'synthetic' (random
  # tokens, for benchmarks) or 'mixture' (the components of data.mixture).
  config.data.source = "text"
  # Comma-separated glob patterns. Empty with 'text' means the bundled
  # Shakespeare.
  config.data.files = ""
  # Field of JSON/Parquet/Arrow records that holds the text (or, with a chat
  # template, the list of {"role", "content"} messages).
  config.data.text_field = "text"
  # Records of plain text files: 'file', 'paragraph' (runs of non-blank
  # lines) or 'line' (non-blank lines).
  config.data.text_unit = "paragraph"
  # With source 'mixture': name -> {source, files, weight[, text_field]},
  # e.g. {"web": {"source": "jsonl", "files": "/d/web/*.jsonl",
  # "weight": 0.7}, "code": {"source": "parquet", "files": "/d/code/*",
  # "weight": 0.3}}. Each component is shuffled with its own seed.
  config.data.mixture = ml_collections.ConfigDict()
  # SentencePiece `.model`, Hugging Face `tokenizer.json`, or tiktoken
  # `.tiktoken` (or Llama 3's tiktoken-format `tokenizer.model`). Empty means
  # the bundled Mistral v1 SentencePiece tokenizer.
  config.data.tokenizer = ""
  # Wrap each plain-text document in BOS / EOS where the vocabulary has them.
  config.data.add_bos = True
  config.data.add_eos = True
  # Post-training: a built-in chat template ('chatml', 'llama3', 'gemma',
  # 'mistral'), a .jinja file or a tokenizer_config.json. Records then hold
  # conversations and only assistant turns count in the loss. Empty: text.
  config.data.chat_template = ""
  # Documents -> rows: 'concat' (concatenate and split), 'first_fit' (bin
  # packing, documents not cut) or 'none' (one document per row, truncated).
  # Each document is its own segment: attention never crosses documents.
  config.data.packing = "concat"
  # Vision-language models: image slots per row (0: text only; the chat
  # records' image parts fill them in order; packing "first_fit" or
  # "none"), and the folder relative image paths are in.
  config.data.images_per_row = 0
  config.data.image_dir = ""
  # A field (column) with each record's images, taken in order by image
  # parts that carry none (Hugging Face datasets' image column).
  config.data.image_field = ""
  # Sized with train.batch_size so that the default small models train on a
  # 2-core CPU in a few minutes; real runs override both.
  config.data.seq_len = 128
  config.data.shuffle_seed = 0
  # Worker processes that read and tokenize records (0: threads of the
  # training process). Changing it keeps resumption exact.
  config.data.num_workers = 0
  # Batches prepared ahead by a background thread.
  config.data.prefetch = 4
  # Bad records (invalid JSON or UTF-8, wrong field type, empty, larger than
  # max_document_bytes) are counted and skipped with a warning naming their
  # file and line; strict stops the run at the first one.
  config.data.strict = False
  config.data.max_document_bytes = 4 * 2**20
  # Evaluation: every eval_every_steps updates (0: off), eval_steps batches
  # of eval_files (read as eval_source, or as source when empty) give
  # eval/loss and eval/perplexity.
  config.data.eval_source = ""
  config.data.eval_files = ""
  config.data.eval_every_steps = 0
  config.data.eval_steps = 10

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
  # Bad updates. False: a NaN/inf loss or gradient norm stops the run naming
  # the step; True: that update is skipped (parameters and optimizer state
  # unchanged) and counted in train/skipped_steps.
  config.train.skip_nonfinite = False
  # Also skip updates whose loss or gradient norm is more than spike_zscore
  # standard deviations above the mean of the last spike_window applied
  # updates (once that many were applied); 0 is off.
  config.train.spike_zscore = 0.0
  config.train.spike_window = 100
  # More skipped updates than this in a row stop the run, naming them.
  config.train.max_consecutive_skips = 10

  config.mesh = ml_collections.ConfigDict()
  # Devices per mesh axis within a slice (ici) and slices per axis (dcn); the
  # mesh axis is their product. -1 takes the rest, at most once per kind.
  # data: data parallel; fsdp, fsdp_transpose: parameters sharded too;
  # sequence: activations split along length; tensor: heads/MLP/vocab split;
  # expert: a batch axis that also splits the experts of MoE layers
  # (expert parallelism); stage: pipeline stages
  # (pipeline.stages follows it; not -1). E.g. 8 devices as 2x2x2
  # fsdp/tensor/sequence:
  #   --config.mesh.ici.data=1 --config.mesh.ici.fsdp=2
  #   --config.mesh.ici.tensor=2 --config.mesh.ici.sequence=2
  config.mesh.ici = mesh_axes(data=-1)
  config.mesh.dcn = mesh_axes()

  # How the model runs, apart from what it is (maxtext.models.execution):
  # none of these changes the parameters or the outputs.
  # maxtext.kernels.dispatch: impl "auto" picks per backend (TPU splash; GPU
  # cuDNN, else the Pallas Triton kernel, else blockwise; CPU blockwise); the
  # blocks tile blockwise, splash and pallas_gpu. With the length split
  # (mesh.ici.sequence > 1) context_parallel "allgather" gathers keys and
  # values whole, "ring" passes them round the devices (maxtext.kernels.ring).
  config.attention_kernel = ml_collections.ConfigDict(dict(
      impl="auto", block_q=512, block_kv=512, context_parallel="allgather",
      linear_chunk=64))
  # Pipeline parallelism (maxtext.layers.pipeline), training only: stages
  # follow the `stage` mesh axis; microbatches are batch slices flowing
  # through it (0: one per stage); repeats are passes through the stages (1
  # GPipe, more a circular schedule).
  config.pipeline = ml_collections.ConfigDict(dict(
      stages=config.mesh.ici.get_ref("stage") *
      config.mesh.dcn.get_ref("stage"),
      microbatches=0, repeats=1))
  # Recomputation in the backward pass of each block (maxtext.layers.remat):
  # "none", "full", "minimal", "save_dot_except_mlp", "save_qkv_proj",
  # "save_out_proj", "nothing_saveable" or "custom". custom: (activation
  # name, "keep" | "offload") pairs; unlisted activations are recomputed;
  # offload saves to host memory. Names: query_proj, key_proj, value_proj,
  # attention_context, out_proj, mlp_gate, mlp_up, mlp_hidden, mlp_out. E.g.
  #   --config.remat.policy=custom \
  #   --config.remat.custom='(("mlp_hidden", "offload"),)'
  config.remat = ml_collections.ConfigDict(dict(policy="none", custom=()))

  config.sharding = sharding_defaults()

  config.checkpoint = ml_collections.ConfigDict()
  # Persistent tier: <workdir>/checkpoints, every every_steps updates (0: only
  # at the end), also every every_minutes minutes (0: off), at the end and on
  # SIGTERM (preemption). A rerun with the same workdir resumes from the
  # newest checkpoint of either tier that passes its checksum manifest.
  config.checkpoint.every_steps = 50
  config.checkpoint.every_minutes = 0.0
  config.checkpoint.max_to_keep = 3
  # Files are written in the background while training goes on.
  config.checkpoint.async_save = True
  # Local tier: a fast folder (local SSD, RAM disk) saved every
  # local_every_steps updates, keeping the newest local_max_to_keep; it
  # bounds what a crash loses. local_dir is relative to the workdir and must
  # stay inside it (a symlink there may point to e.g. /dev/shm/<run>); ""
  # turns the tier off. It must be visible to every process of the run,
  # unless local_peers: then it is each process's own storage (a link that
  # resolves to each machine's disk), each process saves its own shards
  # there, and a process that lost them restores from a peer replica (the
  # mesh's data axis must span the processes; maxtext.checkpoint.peer).
  config.checkpoint.local_dir = ""
  config.checkpoint.local_every_steps = 0
  config.checkpoint.local_max_to_keep = 2
  config.checkpoint.local_peers = False

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


# The sizes Qwen3-Next (`configs/qwen3_next.py`) and Qwen3.5
# (`configs/qwen3_5.py`, `configs/qwen3_5_moe.py`) share, and their experts'.
# DeepSeek-V3's sizes and training settings (configs/deepseek3.py), which
# DeepSeek-V3.2 keeps (configs/deepseek3_2.py).
DEEPSEEK3_SIZES = dict(
    vocab_size=129_280, num_layers=61, embed_dim=7168, mlp_dim=18_432,
    moe_mlp_dim=2048, num_heads=128, num_kv_heads=128, head_dim=64,
    tie_embeddings=False, norm_eps=1e-6, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, v_head_dim=128, rope_interleave=True,
    rope_theta=10_000.0, rope_scaling="yarn", rope_scaling_factor=40.0,
    rope_original_max_length=4096, rope_yarn_beta_fast=32.0,
    rope_yarn_beta_slow=1.0, rope_yarn_mscale=1.0,
    rope_yarn_mscale_all_dim=1.0, num_experts=256, num_experts_per_token=8,
    num_shared_experts=1, first_dense_layers=3, router_normalize=True,
    router_bias_update_rate=0.001, routed_scaling_factor=2.5,
    num_expert_groups=8, expert_groups_per_token=4,
    load_balance_loss_weight=1e-4, mtp_layers=1, mtp_loss_weight=0.1)
# DeepSeek-V3's small CPU variant, which DeepSeek-V3.2's small one extends.
DEEPSEEK3_SMALL = dict(
    vocab_size=32_000, num_layers=4, embed_dim=256, mlp_dim=512,
    moe_mlp_dim=128, num_heads=4, num_kv_heads=4, head_dim=16,
    q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, v_head_dim=32,
    num_experts=16, num_experts_per_token=4, num_expert_groups=4,
    expert_groups_per_token=2, first_dense_layers=1, rope_scaling_factor=4.0,
    rope_original_max_length=64)
QWEN3_NEXT_SIZES = dict(
    num_heads=16, num_kv_heads=2, head_dim=256, tie_embeddings=False,
    rope_theta=10_000_000.0, rope_partial_factor=0.25,
    linear_num_key_heads=16, linear_num_value_heads=32,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_taps=4,
    full_attention_interval=4)
QWEN3_NEXT_MOE_SIZES = dict(num_shared_experts=1, shared_expert_gate=True,
                            router_normalize=True,
                            load_balance_loss_weight=0.001)
