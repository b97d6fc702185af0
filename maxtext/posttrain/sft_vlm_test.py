"""Vision-language SFT (`configs/sft_vlm.py`) of a tiny Gemma 3 model on the
bundled caption set: the loss falls, the trained model reads the images
(shuffled or blank pictures cost it clearly more), the tower stays frozen,
throughput and MFU count its FLOPs, a resumed run equals an uninterrupted
one, LoRA trains the decoder only, and the export loads in transformers
with the same logits."""

import os
import tempfile

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import torch
import transformers

from configs import sft_vlm as sft_vlm_config
from maxtext.checkpoint import hf_convert
from maxtext.checkpoint import params_checkpoint
from maxtext.data import caption_task
from maxtext.data import images
from maxtext.data import pipeline
from maxtext.metrics import flops
from maxtext.metrics import writers
from maxtext.posttrain import adapter
from maxtext.posttrain import base_model
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import sft
from maxtext.posttrain.config import PosttrainConfig
from testing import hf_tiny_models
from testing import trees

_STEPS = 40


def _config(folder, ckpt, captions, steps, variant="gemma3"):
  config = sft_vlm_config.get_config(variant)
  config.train.load = ckpt
  config.train.steps = steps
  config.data.tokenizer = os.path.join(folder, "hf", "tokenizer.json")
  config.data.chat_template = pt.template_file(folder)
  config.data.files = os.path.join(captions, caption_task.RECORDS)
  config.data.image_dir = captions
  config.data.images_per_row = 2
  config.data.seq_len = 32
  config.data.prefetch = 0
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 0
  config.logging.tensorboard = False
  return config


class SftVisionLanguageTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.ckpt = pt.write_checkpoint(cls.folder, "gemma3_vlm")
    cls.captions = os.path.join(cls.folder, "captions")
    caption_task.write(cls.captions, 96, seed=0)
    cls.eval_file = caption_task.write(cls.captions, 32, seed=1, start=96,
                                       name="eval.jsonl")
    cls.result = sft.run(_config(cls.folder, cls.ckpt, cls.captions, _STEPS),
                         os.path.join(cls.folder, "full"))

  def _eval_losses(self, checkpoint):
    """Eval-split loss of `checkpoint` with its images, with each row's
    images moved to the next row (shuffled), and with blank pictures."""
    config = _config(self.folder, self.ckpt, self.captions, 1)
    config.data.eval_files = self.eval_file
    config.data.eval_steps = 2
    posttrain = PosttrainConfig.from_config_dict(config)
    loaded = base_model.load_model(checkpoint)
    inputs = sft.image_inputs(loaded, posttrain.data)
    batches = list(pipeline.eval_batches(posttrain.data, batch_size=8,
                                         vocab_size=128,
                                         image_inputs=inputs))
    white = images.preprocess(Image.new("RGB", (28, 28), "white"),
                              inputs.settings)
    loss = nnx.jit(sft.sft_loss)
    losses = {"true": [], "shuffled": [], "blank": []}
    for batch in batches:
      keys = {k: jnp.asarray(batch[k]) for k in pipeline.model_keys(
          posttrain.data)}
      pictures = keys.pop("images")
      present = jnp.any(pictures != 0, axis=(2, 3, 4), keepdims=True)
      for name, shown in (("true", pictures),
                          ("shuffled", jnp.roll(pictures, 1, axis=0)),
                          ("blank", jnp.where(present, white, 0.0))):
        losses[name].append(float(loss(loaded.model, images=shown, **keys)))
    return {name: float(np.mean(values)) for name, values in losses.items()}

  def test_loss_falls_and_the_model_reads_the_images(self):
    metrics = writers.read_jsonl(os.path.join(self.folder, "full",
                                              "metrics.jsonl"))
    first, last = metrics[1]["train/loss"], metrics[_STEPS]["train/loss"]
    before = self._eval_losses(self.ckpt)
    after = self._eval_losses(self.result.exported["export"])
    print(f"VLM SFT: train/loss {first:.3f} -> {last:.3f}; eval before "
          f"{before}, after {after}")
    self.assertLess(last, first / 4)
    # Throughput and MFU count the tower's FLOPs (forward: it is frozen).
    cfg = params_checkpoint.load_params(self.ckpt)[0]
    per_token = (flops.training_flops_per_token(cfg, 32) + 8 * 2 *
                 flops.vision_flops_per_image(cfg, trained=False) / (8 * 32))
    perf = metrics[_STEPS]
    self.assertAlmostEqual(
        perf["perf/tflops_per_s_per_device"] * 1e12 /
        perf["perf/tokens_per_s_per_device"], per_token, delta=1e-3)
    self.assertIn("perf/mfu", perf)  # n/a (None) on a CPU.
    self.assertLess(after["true"], before["true"] / 4)
    # What it learned comes from the pictures.
    self.assertGreater(after["shuffled"], after["true"] + 0.3)
    self.assertGreater(after["blank"], after["true"] + 0.3)

  def test_tower_frozen_projector_trained(self):
    _, start = params_checkpoint.load_params(self.ckpt)
    _, end = params_checkpoint.load_params(self.result.exported["export"])
    for a, b in zip(jax.tree.leaves(start["vision"]),
                    jax.tree.leaves(end["vision"])):
      np.testing.assert_array_equal(a, b)
    self.assertFalse(np.array_equal(start["projector"]["projection"]["kernel"],
                                    end["projector"]["projection"]["kernel"]))

  def test_export_loads_in_transformers(self):
    export = self.result.exported["export"]
    hf_dir = os.path.join(self.folder, "exported_hf")
    hf_convert.orbax_to_hf(export, hf_dir)
    hf_model = transformers.AutoModelForImageTextToText.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    cfg, params = params_checkpoint.load_params(export)
    model = adapter.TunixModel(params_checkpoint.model_from_params(cfg,
                                                                   params))
    ids = pt.VLM_IDS
    tokens = np.array([[5, ids["boi_token_index"]] +
                       [ids["image_token_index"]] * 4 +
                       [ids["eoi_token_index"], 7, 8]])
    pixels = np.random.default_rng(0).uniform(-1, 1, (1, 1, 28, 28, 3))
    logits, _ = model(jnp.asarray(tokens), images=jnp.asarray(pixels))
    with torch.no_grad():
      want = hf_model(
          input_ids=torch.tensor(tokens),
          pixel_values=torch.tensor(pixels[0].transpose(0, 3, 1, 2),
                                    dtype=torch.float32),
          token_type_ids=torch.tensor(
              tokens == ids["image_token_index"]).long()).logits.numpy()
    # The trained model's logits grow: within 1e-4, or 1e-5 of the largest.
    trees.assert_close(np.asarray(logits), want, rtol=1e-5, atol=1e-4,
                       scaled_atol=1e-5)

  def test_resumed_run_equals_uninterrupted(self):
    """Full fine-tuning with the tower frozen (LoRA runs resume as
    sft_test's do)."""
    def config(steps):
      c = _config(self.folder, self.ckpt, self.captions, steps)
      c.optimizer.end_learning_rate_ratio = 1.0  # Constant: any run length.
      return c

    folder = self.create_tempdir().full_path
    straight = sft.run(config(4), os.path.join(folder, "straight"))
    sft.run(config(2), os.path.join(folder, "resumed"))
    resumed = sft.run(config(4), os.path.join(folder, "resumed"))
    self.assertEqual(resumed.trainer.train_steps, 4)
    got, want = (writers.read_jsonl(os.path.join(folder, name,
                                                 "metrics.jsonl"))
                 for name in ("resumed", "straight"))
    for step in (1, 2, 3, 4):  # The same batches, images included.
      self.assertAlmostEqual(got[step]["train/loss"],
                             want[step]["train/loss"], places=5)
    self.assertLess(want[4]["train/loss"], want[1]["train/loss"])
    got, want = (params_checkpoint.load_params(r.exported["export"])[1]
                 for r in (resumed, straight))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, atol=1e-6)

  def test_lora_trains_the_decoder_only(self):
    result = sft.run(_config(self.folder, self.ckpt, self.captions, 3,
                             "gemma3_lora"),
                     os.path.join(self.folder, "lora"))
    metrics = writers.read_jsonl(os.path.join(self.folder, "lora",
                                              "metrics.jsonl"))
    self.assertLess(metrics[3]["train/loss"], metrics[1]["train/loss"])
    _, start = params_checkpoint.load_params(self.ckpt)
    _, end = params_checkpoint.load_params(result.exported["export"])
    for part in ("vision", "projector"):
      for a, b in zip(jax.tree.leaves(start[part]),
                      jax.tree.leaves(end[part])):
        np.testing.assert_array_equal(a, b)
    self.assertFalse(np.array_equal(
        start["blocks"]["attention"]["query"]["kernel"],
        end["blocks"]["attention"]["query"]["kernel"]))

  def test_images_need_a_vision_model(self):
    config = _config(self.folder, pt.write_checkpoint(
        os.path.join(self.folder, "text")), self.captions, 1)
    with self.assertRaisesRegex(ValueError, "needs a model with a vision "
                                "tower"):
      sft.run(config, os.path.join(self.folder, "bad"))


class SftLlama4VisionTest(absltest.TestCase):
  """`sft_vlm.py:llama4` on the tiny Llama 4 vision-language model: each
  28-pixel caption picture is one tile (`image_tiles`), its prompt Llama 4's
  (start, <|image|>, the tile's placeholders, end); the loss falls, the
  tower stays frozen, and the export loads in transformers with equal
  logits."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.ckpt = pt.write_checkpoint(cls.folder, "llama4_vlm")
    captions = os.path.join(cls.folder, "captions")
    caption_task.write(captions, 96, seed=0)
    config = _config(cls.folder, cls.ckpt, captions, 30, "llama4")
    cls.result = sft.run(config, os.path.join(cls.folder, "full"))

  def test_loss_falls_tower_frozen_and_export_loads(self):
    metrics = writers.read_jsonl(os.path.join(self.folder, "full",
                                              "metrics.jsonl"))
    first, last = metrics[1]["train/loss"], metrics[30]["train/loss"]
    print(f"Llama 4 VLM SFT: train/loss {first:.3f} -> {last:.3f}")
    self.assertLess(last, first / 4)
    export = self.result.exported["export"]
    _, start = params_checkpoint.load_params(self.ckpt)
    cfg, end = params_checkpoint.load_params(export)
    for a, b in zip(jax.tree.leaves(start["vision"]),
                    jax.tree.leaves(end["vision"])):
      np.testing.assert_array_equal(a, b)
    hf_dir = os.path.join(self.folder, "exported_hf")
    hf_convert.orbax_to_hf(export, hf_dir)
    hf_model = transformers.AutoModelForImageTextToText.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    model = adapter.TunixModel(params_checkpoint.model_from_params(cfg, end))
    ids = hf_tiny_models.LLAMA4_VLM_TEXT_IDS
    tokens = np.array([[5, ids["<|image_start|>"], ids["<|image|>"]] +
                       [ids["<|patch|>"]] * 4 + [ids["<|image_end|>"], 7]])
    pixels = np.random.default_rng(0).uniform(-1, 1, (1, 1, 28, 28, 3))
    logits, _ = model(jnp.asarray(tokens), images=jnp.asarray(pixels))
    with torch.no_grad():
      want = hf_model(input_ids=torch.tensor(tokens), pixel_values=torch.tensor(
          pixels[0].transpose(0, 3, 1, 2), dtype=torch.float32)).logits
    trees.assert_close(np.asarray(logits), want.numpy(), rtol=1e-5,
                       atol=1e-4, scaled_atol=1e-5)


if __name__ == "__main__":
  absltest.main()
