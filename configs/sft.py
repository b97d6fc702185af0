"""Supervised fine-tuning (full, LoRA, QLoRA) of a converted checkpoint.

The model is the checkpoint's (--load, from //maxtext/bin:convert_ckpt or a
training run); the config holds the data, the optimizer, the method and
LoRA settings, the mesh and the export. Chat records (`messages` in
data.text_field, or prompt/completion columns with sft.prompt_field and
sft.completion_field) are rendered by data.chat_template; the loss counts
the assistant turns only.

  tools/bazel run //maxtext/bin:sft -- --config=configs/sft.py:lora \
      --load=ckpts/qwen3_0.6b --workdir=runs/sft_try \
      --config.data.files=data/chat.jsonl \
      --config.data.chat_template=ckpts/qwen3_0.6b/tokenizer_config.json \
      --config.data.tokenizer=ckpts/qwen3_0.6b/tokenizer.json

Variants: full (default: every parameter trains), lora, qlora (adapters on
an nf4 base), smollm2 (the CPU demo: LoRA on SmolLM2-135M-Instruct; see
docs/posttrain.md for the data and checkpoint commands). The trained model
is written to <workdir>/export (adapters merged), which //maxtext/bin:decode
and //maxtext/bin:convert_ckpt --to_hf read.

This module also builds the sections every post-training config shares
(`posttrain_config`), for configs/dpo.py and configs/distill.py.
"""

import ml_collections

from configs import common

VARIANTS = ("full", "lora", "qlora", "smollm2")


def lora_defaults(mode: str) -> ml_collections.ConfigDict:
  """The `lora` section (maxtext.posttrain.lora.LoraConfig)."""
  return ml_collections.ConfigDict(dict(
      # "full": every parameter trains; "lora": adapters only; "qlora":
      # adapters on a quantized frozen base.
      mode=mode,
      rank=8,
      alpha=16.0,
      dropout=0.0,
      # Regex over module paths such as "blocks/3/attention/query" that must
      # fully match a projection to adapt it; default: every attention and
      # MLP projection.
      module_path=(r"blocks/\d+/(attention/(query|key|value|output)"
                   r"|mlp/(gate|up|down))"),
      # qlora: base kernels stored as "nf4" or "int8", with one scale per
      # output channel (tile_size=0) or per tile of input rows.
      base_qtype="nf4",
      tile_size=0,
  ))


def posttrain_config(method: str) -> ml_collections.ConfigDict:
  """The sections every post-training method shares, for `method`."""
  base = common.base_config()
  config = ml_collections.ConfigDict()

  config.data = base.data
  config.data.source = "jsonl"
  config.data.text_field = "messages"
  # The template renders conversations; only assistant turns count.
  config.data.chat_template = "chatml"
  # Documents are never cut; rows are padded.
  config.data.packing = "first_fit"
  config.data.seq_len = 256

  config.optimizer = base.optimizer
  config.optimizer.learning_rate = 2e-5
  config.optimizer.warmup_steps = 10
  config.optimizer.weight_decay = 0.0

  config.train = ml_collections.ConfigDict(dict(
      # "sft", "dpo", "orpo" (//maxtext/bin:sft) or "distill"
      # (//maxtext/bin:distill).
      method=method,
      # The starting checkpoint; the binaries' --load flag sets it.
      load="",
      steps=100,
      # Sequences (preference pairs for dpo/orpo) per update.
      batch_size=8,
      # Gradient accumulation: slices of batch_size / microbatches rows.
      microbatches=1,
      seed=0,
      # Trainable state saved to <workdir>/tunix_checkpoints every this many
      # updates (0: at the end); a rerun resumes from the newest.
      checkpoint_every_steps=0,
      max_checkpoints=2,
  ))
  if method != "distill":
    # An sft step saved by aot_compile --save for this run, trained with
    # instead of compiling it (sft only); the sft binary's --compiled flag
    # sets it.
    config.train.compiled = ""

  config.lora = lora_defaults("full")
  # How the model runs (pipeline parallelism is pre-training's only).
  config.attention_kernel = base.attention_kernel
  config.remat = base.remat
  config.mesh = base.mesh
  config.sharding = base.sharding

  config.export = ml_collections.ConfigDict(dict(
      # <workdir>/export: converted checkpoint, adapters merged.
      merged=True,
      # <workdir>/hf: also the Hugging Face folder of it.
      hf=False,
      # <workdir>/peft_adapter: LoRA adapters as a Hugging Face PEFT folder.
      peft_adapter=False,
  ))
  config.logging = ml_collections.ConfigDict(dict(tensorboard=True))
  return config


def sft_defaults() -> ml_collections.ConfigDict:
  """The `sft` section: prompt/completion columns instead of messages."""
  return ml_collections.ConfigDict(dict(
      prompt_field="", completion_field="",
      # A vision-language model's tower trains too (full mode); False:
      # frozen, its projector trains.
      train_vision=False))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the SFT config of variant `arg` (None means "full")."""
  variant = arg or "full"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown sft variant {variant!r}; valid variants:"
                     f" {sorted(VARIANTS)}.")
  config = posttrain_config("sft")
  config.sft = sft_defaults()
  if variant in ("lora", "qlora", "smollm2"):
    config.lora.mode = "qlora" if variant == "qlora" else "lora"
    config.optimizer.learning_rate = 2e-4
  if variant == "smollm2":
    # A few hundred short conversations on 2 CPU cores in minutes.
    config.data.seq_len = 128
    config.train.steps = 40
    config.train.batch_size = 8
    config.optimizer.warmup_steps = 4
    config.data.eval_every_steps = 20
    config.data.eval_steps = 4
  return config
