"""Supervised fine-tuning of a vision-language model on chat records with
images (docs/multimodal.md).

The model is a converted vision-language checkpoint (--load; Gemma 3
4b/12b/27b from google/gemma-3-*-it via //maxtext/bin:convert_ckpt). Records
hold conversations whose user turns have image parts ({"type": "image",
"path": ...} relative to data.image_dir, or the image's bytes) and text
parts; the chat template puts the family's image placeholders where the
parts are, the images fill them, and the loss counts the assistant turns.
The vision tower stays frozen (sft.train_vision) and its projector trains;
LoRA adapts the decoder's projections only.

  tools/bazel run //maxtext/data:write_captions -- --out=data/captions
  tools/bazel run //maxtext/bin:sft -- --config=configs/sft_vlm.py:gemma3 \
      --load=ckpts/gemma3_4b --workdir=runs/sft_vlm \
      --config.data.files=data/captions/captions.jsonl \
      --config.data.eval_files=data/captions/captions_eval.jsonl \
      --config.data.eval_every_steps=50 \
      --config.data.image_dir=data/captions

Variants: gemma3 (full), gemma3_lora, gemma3_qlora; llama4 and llama4_lora
(Llama 4 Scout or Maverick with their tower, `configs/llama4.py:scout_vlm`:
each image becomes up to 16 tiles and a global view of 144 soft tokens
each, `maxtext.data.image_tiles`; give the checkpoint's chat template with
--config.data.chat_template=<hf folder>/tokenizer_config.json, its tokenizer
with --config.data.tokenizer). The trained model is written to
<workdir>/export (adapters merged, tower included), which
//maxtext/bin:decode --image and //maxtext/bin:convert_ckpt --to_hf read.
"""

import ml_collections

from configs import sft

VARIANTS = ("gemma3", "gemma3_lora", "gemma3_qlora", "llama4", "llama4_lora")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "gemma3")."""
  variant = arg or "gemma3"
  if variant not in VARIANTS:
    raise ValueError(f"Unknown sft_vlm variant {variant!r}; valid variants:"
                     f" {sorted(VARIANTS)}.")
  family, _, method = variant.partition("_")
  config = sft.get_config(method or "full")
  if family == "llama4":
    # One image's slots: up to 16 tiles and its global view of 144 soft
    # tokens each (2,448 tokens), plus its markup and a conversation.
    config.data.chat_template = ""
    config.data.images_per_row = 17
    config.data.seq_len = 4096
  else:
    config.data.chat_template = "gemma"
    # One image of 256 soft tokens (and its markup) plus a conversation.
    config.data.images_per_row = 1
    config.data.seq_len = 512
  config.data.packing = "first_fit"
  config.train.batch_size = 8
  return config
