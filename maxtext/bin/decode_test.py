"""Tests the decode binary end to end on a converted tiny Llama checkpoint:
dumped prefill logits and greedy generations equal transformers' (with the
dense and the paged KV cache); with --quantize=int8 the logits stay near
them."""

import contextlib
import io
import json
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import flagsaver
import numpy as np
from PIL import Image
import tokenizers
import torch
import transformers
from transformers.models.gemma3 import image_processing_pil_gemma3

from maxtext.bin import decode
from maxtext.checkpoint import hf_convert
from maxtext.data import image_tiles
from maxtext.data import images as images_lib
from maxtext.posttrain import posttrain_testing as pt
from testing import hf_tiny_models

_IDS = [5, 17, 99, 3, 42, 8]


def _write_word_tokenizer(folder: str) -> None:
  """A tokenizer.json mapping the words w0..w127 to ids 0..127."""
  vocab = {f"w{i}": i for i in range(128)}
  tokenizer = tokenizers.Tokenizer(
      tokenizers.models.WordLevel(vocab, unk_token="w0"))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer.save(os.path.join(folder, "tokenizer.json"))


class _DecodeTestCase(absltest.TestCase):
  """Runs the binary as `bazel run` from a folder holding a tiny Hugging
  Face model (`hf/`) and its conversion (`ours/`)."""

  max_new_tokens = 8

  def _convert(self, hf_model, *, word_tokenizer: bool = False) -> None:
    self.user_dir = self.create_tempdir().full_path
    self.hf_model = hf_model
    hf_dir = os.path.join(self.user_dir, "hf")
    hf_model.save_pretrained(hf_dir)
    if word_tokenizer:
      _write_word_tokenizer(hf_dir)
    hf_convert.hf_to_orbax(hf_dir, os.path.join(self.user_dir, "ours"))
    self.enter_context(mock.patch.dict(
        os.environ, {"BUILD_WORKING_DIRECTORY": self.user_dir}))

  def _run(self, **flag_values) -> str:
    stdout = io.StringIO()
    with flagsaver.flagsaver(**{"checkpoint": "ours",
                                "max_new_tokens": self.max_new_tokens,
                                **flag_values}):
      with contextlib.redirect_stdout(stdout):
        decode.main(["decode"])
    return stdout.getvalue()


class DecodeBinaryTest(_DecodeTestCase):

  def setUp(self):
    super().setUp()
    self._convert(hf_tiny_models.tiny_hf_model("llama3"), word_tokenizer=True)

  def test_prompt_ids_dump_logits_and_greedy(self):
    printed = self._run(prompt_ids=[str(i) for i in _IDS],
                        dump_logits="logits.npy")
    got = np.load(os.path.join(self.user_dir, "logits.npy"))
    with torch.no_grad():
      want = self.hf_model(torch.tensor([_IDS])).logits[0].numpy()
    self.assertEqual((got.dtype, got.shape), (np.float32, (len(_IDS), 128)))
    diff = float(np.abs(got - want).max())
    print(f"decode --dump_logits: max |logit diff| = {diff:.3g}")
    self.assertLessEqual(diff, 1e-4)
    greedy = hf_tiny_models.hf_greedy(self.hf_model, _IDS, 8)
    self.assertEqual(printed.strip(), ",".join(map(str, _IDS)) + " -> " +
                     ",".join(map(str, greedy)))

  def test_text_prompts_use_the_checkpoint_tokenizer(self):
    printed = self._run(prompt=["w5 w17 w99", "w3"])
    lines = printed.strip().splitlines()
    self.assertLen(lines, 2)
    for line, ids in zip(lines, ([5, 17, 99], [3])):
      words = " ".join(f"w{i}" for i in
                       hf_tiny_models.hf_greedy(self.hf_model, ids, 8))
      prompt = " ".join(f"w{i}" for i in ids)
      self.assertEqual(line, f"{prompt!r} -> {words!r}")

  def test_paged_kv_cache_generates_transformers_greedy(self):
    printed = self._run(prompt_ids=[str(i) for i in _IDS], kv_cache="paged",
                        page_size=4, num_pages=4)
    greedy = hf_tiny_models.hf_greedy(self.hf_model, _IDS, 8)
    self.assertEqual(printed.strip(), ",".join(map(str, _IDS)) + " -> " +
                     ",".join(map(str, greedy)))

  def test_quantize_int8_stays_near_full_precision(self):
    printed = self._run(prompt_ids=[str(i) for i in _IDS],
                        dump_logits="logits.npy", quantize="int8")
    got = np.load(os.path.join(self.user_dir, "logits.npy"))
    with torch.no_grad():
      want = self.hf_model(torch.tensor([_IDS])).logits[0].numpy()
    error = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"decode --quantize=int8: max |logit diff| / max |logit| ="
          f" {error:.3g}")
    # Measured 1.7%; full precision is within 1e-4 absolute.
    self.assertLess(error, 0.03)
    self.assertGreater(error, 1e-5)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    prompt, generated = printed.strip().split(" -> ")
    self.assertEqual(prompt, ",".join(map(str, _IDS)))
    generated = [int(i) for i in generated.split(",")]
    self.assertLen(generated, 8)
    self.assertEqual(generated[0], int(got[-1].argmax()))

  def test_bad_quantize_is_named(self):
    with self.assertRaisesRegex(SystemExit, r"^decode: error: ValueError: .*"
                                r"quantize='int4' is invalid; valid:"
                                r" \['int8'\]"):
      self._run(prompt_ids=["1"], quantize="int4")

  def test_user_mistakes_are_one_line(self):
    for flag_values, message in (
        (dict(prompt_ids=["1", "128"]),
         r"--prompt_ids entry 128 is outside the model's vocabulary; valid"
         r" ids: 0 to 127\.$"),
        (dict(prompt_ids=["1", "x"]),
         r"--prompt_ids entry 'x' is not a token id"),
        (dict(prompt_ids=["1"], checkpoint="missing"),
         r"missing"),
        (dict(prompt=["w1 w2"], tokenizer="missing.json"),
         r"missing\.json"),
    ):
      with self.subTest(flag_values), self.assertRaisesRegex(
          SystemExit, r"^decode: error: \w+: [^\n]*" + message):
        self._run(**flag_values)

  def test_needs_exactly_one_kind_of_prompt(self):
    with self.assertRaisesRegex(Exception, "--prompt"):
      self._run()


class DecodeImagesTest(_DecodeTestCase):
  """--image with --prompt_ids on a converted tiny Gemma 3 vision-language
  model: logits and greedy tokens equal transformers'."""

  max_new_tokens = 6

  def setUp(self):
    super().setUp()
    self._convert(hf_tiny_models.tiny_gemma3_vlm())
    ids = hf_tiny_models.GEMMA3_VLM_IDS
    image = [ids["boi_token_index"]] + [ids["image_token_index"]] * 4 + [
        ids["eoi_token_index"]]
    self.ids = [5, 17] + image + [3, 42] + image + [8, 9, 10]
    rng = np.random.default_rng(0)
    self.images = []
    for i in range(2):
      path = os.path.join(self.user_dir, f"image{i}.png")
      Image.fromarray(rng.integers(0, 256, (40 + 9 * i, 31, 3),
                                   dtype=np.uint8)).save(path)
      self.images.append(f"image{i}.png")

  def test_prompt_ids_with_images(self):
    printed = self._run(prompt_ids=[str(i) for i in self.ids],
                        image=self.images, dump_logits="logits.npy")
    processor = image_processing_pil_gemma3.Gemma3ImageProcessorPil(
        size={"height": 28, "width": 28}, do_pan_and_scan=False)
    pixels = processor(
        [Image.open(os.path.join(self.user_dir, name))
         for name in self.images], return_tensors="pt")["pixel_values"]
    tokens = torch.tensor([self.ids])
    inputs = dict(input_ids=tokens, pixel_values=pixels,
                  token_type_ids=(tokens == 99).long(),
                  attention_mask=torch.ones_like(tokens))
    with torch.no_grad():
      want = self.hf_model(**inputs).logits[0].numpy()
      greedy = self.hf_model.generate(**inputs, max_new_tokens=6,
                                      do_sample=False)[0, len(self.ids):]
    got = np.load(os.path.join(self.user_dir, "logits.npy"))
    self.assertLessEqual(float(np.abs(got - want).max()), 1e-4)
    self.assertEqual(printed.strip(), ",".join(map(str, self.ids)) + " -> " +
                     ",".join(map(str, greedy.tolist())))

  def test_text_prompt_with_images_through_the_chat_template(self):
    folder = os.path.join(self.user_dir, "vlm")
    ckpt = pt.write_checkpoint(folder, "gemma3_vlm")
    printed = self._run(checkpoint=ckpt, prompt=["describe the picture"],
                        image=self.images[:1], max_new_tokens=4,
                        chat_template=pt.template_file(folder))
    # The template's user turn: the image's ids ("\n\n" is no word of
    # this tokenizer), the text, then the generation prompt.
    with open(os.path.join(folder, "hf", "tokenizer.json"),
              encoding="utf-8") as f:
      vocab = json.load(f)["model"]["vocab"]
    ids = pt.VLM_IDS
    prompt = ([vocab["user"], ids["boi_token_index"]] +
              [ids["image_token_index"]] * 4 + [ids["eoi_token_index"]] +
              [vocab[w] for w in ("describe", "the", "picture")] +
              [vocab["assistant"]])
    hf_model = transformers.AutoModelForImageTextToText.from_pretrained(
        os.path.join(folder, "hf"), dtype=torch.float32,
        attn_implementation="eager").eval()
    processor = image_processing_pil_gemma3.Gemma3ImageProcessorPil(
        size={"height": 28, "width": 28}, do_pan_and_scan=False)
    tokens = torch.tensor([prompt])
    with torch.no_grad():
      greedy = hf_model.generate(
          input_ids=tokens, attention_mask=torch.ones_like(tokens),
          pixel_values=processor(
              Image.open(os.path.join(self.user_dir, self.images[0])),
              return_tensors="pt")["pixel_values"],
          token_type_ids=(tokens == ids["image_token_index"]).long(),
          max_new_tokens=4, do_sample=False)[0, len(prompt):].tolist()
    words = {i: w for w, i in vocab.items()}
    self.assertEqual(printed.strip().split(" -> ")[1],
                     repr(" ".join(words[i] for i in greedy)))

  def test_mistakes_are_one_line_errors(self):
    with open(os.path.join(self.user_dir, "decode.txt"), "w",
              encoding="utf-8") as f:
      f.write("not an image")
    for flag_values, message in (
        (dict(prompt_ids=[str(i) for i in self.ids], image=self.images[:1]),
         "holds 8 image placeholders"),
        (dict(prompt_ids=[str(i) for i in self.ids],
              image=["missing.png", self.images[1]]),
         "missing.png does not exist"),
        (dict(prompt_ids=[str(i) for i in self.ids], image=["decode.txt"] * 2),
         "decode.txt cannot be read"),
    ):
      with self.assertRaisesRegex(SystemExit, f"decode: error: .*{message}"):
        self._run(**flag_values)


class DecodeLlama4ImagesTest(_DecodeTestCase):
  """--image on a converted tiny Llama 4 vision-language model: each image
  becomes its tiles (`maxtext.data.image_tiles`; a 2 x 3 grid and the
  global view, and one tile); with --prompt_ids the logits and greedy
  tokens equal transformers' on the same tiles."""

  max_new_tokens = 6

  def setUp(self):
    super().setUp()
    self._convert(hf_tiny_models.tiny_llama4_vlm(), word_tokenizer=True)
    rng = np.random.default_rng(0)
    settings = images_lib.ImageSettings(height=28, width=28)
    names = {"start": "<|image_start|>", "patch": "<|patch|>",
             "x_separator": "<|tile_x_separator|>",
             "y_separator": "<|tile_y_separator|>", "image": "<|image|>",
             "end": "<|image_end|>"}
    ids = {key: hf_tiny_models.LLAMA4_VLM_TEXT_IDS[name]
           for key, name in names.items()}
    self.images, tiles, self.ids = [], [], [5, 17]
    for i, size in enumerate(((50, 80), (20, 25))):
      path = os.path.join(self.user_dir, f"image{i}.png")
      Image.fromarray(rng.integers(0, 256, (*size, 3),
                                   dtype=np.uint8)).save(path)
      self.images.append(f"image{i}.png")
      pixels, grid = image_tiles.tiles(images_lib.load(path), settings,
                                       max_tiles=16)
      tiles.append(pixels)
      self.ids += image_tiles.prompt_ids(*grid, 4, ids) + [3, 42]
    self.pixels = np.concatenate(tiles)
    self.assertLen(self.pixels, 2 * 3 + 1 + 1)

  def test_prompt_ids_with_images(self):
    printed = self._run(prompt_ids=[str(i) for i in self.ids],
                        image=self.images, dump_logits="logits.npy")
    inputs = dict(input_ids=torch.tensor([self.ids]),
                  pixel_values=torch.tensor(self.pixels.transpose(0, 3, 1, 2)))
    with torch.no_grad():
      want = self.hf_model(**inputs).logits[0].numpy()
      greedy = self.hf_model.generate(
          **inputs, attention_mask=torch.ones_like(inputs["input_ids"]),
          max_new_tokens=6, do_sample=False)[0, len(self.ids):]
    got = np.load(os.path.join(self.user_dir, "logits.npy"))
    self.assertLessEqual(float(np.abs(got - want).max()), 1e-4)
    self.assertEqual(printed.strip(), ",".join(map(str, self.ids)) + " -> " +
                     ",".join(map(str, greedy.tolist())))

  def test_mistakes(self):
    with self.assertRaisesRegex(
        SystemExit, "decode: error: .*holds 32 image placeholders.*need 28"):
      self._run(prompt_ids=[str(i) for i in self.ids], image=self.images[:1])
    with self.assertRaisesRegex(
        SystemExit, "decode: error: .*no built-in chat template"):
      self._run(prompt=["w1 w2"], image=self.images[:1])


if __name__ == "__main__":
  absltest.main()
