r"""Generates text from a checkpoint with a KV cache.

Loads a converted checkpoint (convert_ckpt), a training checkpoint
<workdir>/checkpoints/<step> or a workdir (its latest step), prefills the
prompts and generates token by token: greedy by default, or sampled with
--temperature, --top_k, --top_p. The tokenizer defaults to the one stored in
the checkpoint, else the bundled Mistral tokenizer. --prompt_ids with
--dump_logits writes the prefill logits [len, vocab] (float32 .npy) for
comparing with other systems. --quantize=int8 stores the attention, MLP and
output-head kernels as int8 with a scale per output channel (weight-only
post-training quantization, `maxtext.quant.ptq`): about 4x less memory for
those weights. --kv_cache=paged keeps the KV cache in pages of --page_size
tokens allocated as the rows grow (--num_pages caps the pool), read by
--paged_attention_impl at each step; same tokens as the dense cache.

Vision-language models (Gemma 3 4b/12b/27b): --image=PATH (repeatable)
gives every prompt those images, preprocessed as the checkpoint's
`preprocessor_config.json` says (`maxtext.data.images`). A --prompt then
becomes one user turn of the chat template (--chat_template, default the
family's) holding the images, then the text, then the generation prompt;
the template's image parts become the family's placeholder ids. With
--prompt_ids the ids are what transformers' model gets as `input_ids`
(placeholders expanded, one per soft token), the images fill them in order.

Example:

  tools/bazel run //maxtext/bin:decode -- --checkpoint=ckpts/qwen3_0.6b \
      --prompt="The capital of France is" --max_new_tokens=32
  tools/bazel run //maxtext/bin:decode -- --checkpoint=ckpts/gemma3_4b \
      --image=cat.jpg --prompt="What is in the picture?"
"""

from maxtext.common import host_memory
from maxtext.common import paths

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position

from absl import app
from absl import flags
from absl import logging
import numpy as np

from maxtext.checkpoint import params_checkpoint
from maxtext.common import cli
from maxtext.data import assets
from maxtext.data import chat_template
from maxtext.data import images as images_lib
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.inference import generate
from maxtext.inference import sampler
from maxtext.kernels import paged_attention
from maxtext.models import registry
from maxtext.posttrain import base_model
from maxtext.quant import ptq

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Converted checkpoint, training checkpoint or workdir.")
_TOKENIZER = flags.DEFINE_string(
    "tokenizer", None, "Tokenizer file; default: the checkpoint's, else the "
    "bundled Mistral one.")
_PROMPT = flags.DEFINE_multi_string("prompt", [], "A prompt (repeatable).")
_PROMPT_IDS = flags.DEFINE_list("prompt_ids", [], "A prompt as token ids.")
_DUMP_LOGITS = flags.DEFINE_string(
    "dump_logits", None, "With --prompt_ids: write its prefill logits here.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 32, "Per prompt.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "0 is off.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "1 is off.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_QUANTIZE = flags.DEFINE_string(
    "quantize", "", "int8: weight-only int8 kernels (per-channel scales);"
    " empty: the checkpoint's precision.")
_KV_CACHE = flags.DEFINE_enum(
    "kv_cache", "dense", list(generate.KV_CACHES),
    "dense: [batch, length] slots per layer; paged: a pool of pages.")
_PAGE_SIZE = flags.DEFINE_integer("page_size", 16,
                                  "Tokens per page (--kv_cache=paged).")
_NUM_PAGES = flags.DEFINE_integer(
    "num_pages", None, "Pages in the pool (--kv_cache=paged); default: "
    "enough for every prompt to reach its full length.")
_IMAGE = flags.DEFINE_multi_string(
    "image", [], "An image every prompt holds (repeatable; a "
    "vision-language model).")
_CHAT_TEMPLATE = flags.DEFINE_string(
    "chat_template", None, "With --image and --prompt: the template (a "
    "built-in name, .jinja or tokenizer_config.json); default: the "
    "family's.")
_PAGED_ATTENTION_IMPL = flags.DEFINE_enum(
    "paged_attention_impl", "auto", list(paged_attention.IMPLS),
    "Decode attention over the pages (--kv_cache=paged).")


def _tokenizer_path(checkpoint: str) -> str:
  """--tokenizer, else the checkpoint's own (a converted checkpoint's file,
  a training workdir's `data.tokenizer`), else the bundled one."""
  if _TOKENIZER.value:
    return paths.user_path(_TOKENIZER.value)
  return (params_checkpoint.tokenizer_path(checkpoint)
          or assets.default_tokenizer())


def _model(cfg, params):
  """The model of `cfg` holding `params`, quantized by --quantize."""
  if not _QUANTIZE.value:
    return params_checkpoint.model_from_params(cfg, params)
  config = ptq.PtqConfig(qtype=_QUANTIZE.value)
  if cfg.scan_layers:
    params = base_model.unstack_layers(params)
  cfg = cfg.replace(scan_layers=False)
  model = params_checkpoint.model_from_params(cfg, params)
  full_bytes = ptq.param_bytes(model)
  model = ptq.quantize_for_decode(model, config)
  logging.info("Quantized the kernels to %s: parameters %.1f MiB -> %.1f MiB.",
               config.qtype, full_bytes / 2**20,
               ptq.param_bytes(model) / 2**20)
  return model


def _prompt_ids(cfg) -> list[int]:
  """--prompt_ids as token ids of the model of `cfg`.

  Raises:
    ValueError: an entry is not an integer, nor an id of the vocabulary or
      the model's image placeholder.
  """
  vocab_size = cfg.vocab_size
  placeholder = cfg.vision.image_token_id if cfg.vision.layers else None
  ids = []
  for text in _PROMPT_IDS.value:
    try:
      token = int(text)
    except ValueError:
      raise ValueError(f"--prompt_ids entry {text!r} is not a token id; give"
                       " comma-separated integers.") from None
    if not 0 <= token < vocab_size and token != placeholder:
      raise ValueError(f"--prompt_ids entry {token} is outside the model's"
                       f" vocabulary; valid ids: 0 to {vocab_size - 1}.")
    ids.append(token)
  return ids


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if bool(_PROMPT.value) == bool(_PROMPT_IDS.value):
    raise app.UsageError("Give --prompt (repeatable) or --prompt_ids.")
  with cli.errors_in_one_line("decode"):
    _decode()


def _images(cfg, checkpoint: str):
  """--image as what the tower takes: (its `images.ImageInputs`, pixels
  [v, h, w, e] of all of them in order (Llama 4: each image's tiles), each
  image's grid of tiles or None), or (None, None, []) without."""
  if not _IMAGE.value:
    return None, None, []
  if not cfg.vision.layers:
    raise ValueError(f"--image given, and the {cfg.family} model of "
                     f"{checkpoint} has no vision tower (vision_layers=0).")
  inputs = registry.image_inputs(cfg, checkpoint)
  read = [inputs.pixels(images_lib.load(paths.user_path(image)))
          for image in _IMAGE.value]
  return (inputs, np.concatenate([pixels for pixels, _ in read]),
          [grid for _, grid in read])


def _text_prompts(cfg, tokenizer, inputs, grids) -> list[list[int]]:
  """--prompt as ids: plain text, or with --image a chat turn holding the
  images (each image's ids from its `grids` entry, `inputs.ids_for`)."""
  if not _IMAGE.value:
    return [tokenizer.encode(text) for text in _PROMPT.value]
  family = registry.family_module(cfg.family)
  if not (_CHAT_TEMPLATE.value or hasattr(family, "CHAT_TEMPLATE")):
    raise ValueError(f"--image with --prompt renders a chat turn, and the "
                     f"{cfg.family} family has no built-in chat template; "
                     "give the model's with --chat_template.")
  template = chat_template.load_template(
      chat_template.user_template(_CHAT_TEMPLATE.value)
      if _CHAT_TEMPLATE.value else family.CHAT_TEMPLATE)
  encoder = chat_template.ChatEncoder(template, tokenizer)
  image_ids = list(map(inputs.ids_for(tokenizer), grids))
  images = [{"type": "image", "path": path} for path in _IMAGE.value]
  return [encoder.prompt([{"role": "user", "content": images + [
      {"type": "text", "text": text}]}], image_ids) for text in _PROMPT.value]


def _check_placeholders(cfg, prompt: list[int], tiles: int) -> None:
  """With --image (`tiles` images or tiles for the tower), the prompt holds
  one placeholder per soft token."""
  if not _IMAGE.value:
    return
  want = tiles * cfg.vision.tokens_per_image
  got = prompt.count(cfg.vision.image_token_id)
  if got != want:
    raise ValueError(
        f"The prompt holds {got} image placeholders (id "
        f"{cfg.vision.image_token_id}); {len(_IMAGE.value)} --image need "
        f"{want} ({cfg.vision.tokens_per_image} for each of their {tiles} "
        "images or tiles).")


def _decode() -> None:
  checkpoint = paths.user_path(_CHECKPOINT.value)
  cfg, params = params_checkpoint.load_params(checkpoint)
  tokenizer = None
  inputs, pixels, grids = _images(cfg, checkpoint)
  if _PROMPT.value:
    tokenizer_path = _tokenizer_path(checkpoint)
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
    prompts = _text_prompts(cfg, tokenizer, inputs, grids)
    largest = max(max(prompt, default=0) for prompt in prompts)
    if largest >= cfg.vocab_size:
      raise ValueError(
          f"Tokenizer {tokenizer_path} gives id {largest}, outside the"
          f" model's vocabulary (ids 0 to {cfg.vocab_size - 1}); pass the"
          " model's own with --tokenizer.")
  else:
    prompts = [_prompt_ids(cfg)]
  for prompt in prompts:
    _check_placeholders(cfg, prompt, 0 if pixels is None else len(pixels))
  if pixels is not None:  # Every prompt holds the images.
    pixels = np.broadcast_to(pixels, (len(prompts), *pixels.shape))
  model = _model(cfg, params)
  logging.info("Loaded a %s model from %s.", cfg.family, checkpoint)
  if not _PROMPT.value:
    if _DUMP_LOGITS.value:
      path = paths.user_path(_DUMP_LOGITS.value)
      np.save(path, generate.prefill_logits(
          model, prompts[0], None if pixels is None else pixels[0]))
      logging.info("Wrote prefill logits to %s.", path)
  outputs = generate.generate(
      model, prompts, max_new_tokens=_MAX_NEW_TOKENS.value, seed=_SEED.value,
      eos_id=tokenizer.eos_id if tokenizer else None,
      params=sampler.SamplingParams(_TEMPERATURE.value, _TOP_K.value,
                                    _TOP_P.value),
      kv_cache=_KV_CACHE.value, page_size=_PAGE_SIZE.value,
      num_pages=_NUM_PAGES.value,
      paged_attention_impl=_PAGED_ATTENTION_IMPL.value, images=pixels)
  for prompt, output in zip(prompts, outputs):
    if tokenizer:
      print(f"{tokenizer.decode(prompt)!r} -> {tokenizer.decode(output)!r}")
    else:
      print(",".join(map(str, prompt)), "->", ",".join(map(str, output)))


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-decode`."""
  flags.mark_flag_as_required("checkpoint")
  app.run(main)


if __name__ == "__main__":
  console_main()
