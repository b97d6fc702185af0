"""Tests distillation: the loss against numpy, the schedules, the captured
features are the chosen blocks' outputs, a cross-family run lowers the
student's KL to the teacher (also to an NF4-quantized one, which holds the
QLoRA paper's NF4 code book times absmax scales), and alpha = 0 is plain
SFT."""

import dataclasses
import os
import warnings

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import qwix

from maxtext.checkpoint import params_checkpoint
from maxtext.data import pipeline
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.posttrain import base_model
from maxtext.posttrain import distill
from maxtext.posttrain import lora
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import sft
from maxtext.posttrain.config import DistillConfig
from maxtext.posttrain.config import PosttrainConfig
from testing import tiny_configs
from testing import trees


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _numpy_kl(teacher, student, mask, temperature=1.0):
  log_p = _log_softmax(np.asarray(teacher, np.float64) / temperature)
  log_q = _log_softmax(np.asarray(student, np.float64) / temperature)
  kl = (np.exp(log_p) * (log_p - log_q)).sum(-1)
  return (kl * mask).sum() / mask.sum()


class LossTest(parameterized.TestCase):

  @parameterized.parameters("cosine", "l2")
  def test_loss_equals_numpy(self, kind):
    rng = np.random.default_rng(0)
    student = {"logits": rng.normal(size=(2, 5, 7)).astype(np.float32),
               "features": rng.normal(size=(2, 2, 5, 4)).astype(np.float32)}
    teacher = {"logits": rng.normal(size=(2, 5, 7)).astype(np.float32),
               "features": rng.normal(size=(2, 2, 5, 4)).astype(np.float32)}
    targets = rng.integers(0, 7, size=(2, 5))
    mask = (rng.random((2, 5)) > 0.3).astype(np.int32)
    config = DistillConfig(teacher="t", temperature=2.0, alpha=0.9,
                           alpha_end=0.1, alpha_schedule="linear", beta=0.5,
                           beta_end=0.5, feature_layers=((0, 1), (1, 3)),
                           feature_loss=kind)
    strategy = distill.DistillStrategy(config, total_steps=5)
    step = 2  # alpha = 0.9 - 0.8 * 2 / 4 = 0.5.
    loss, metrics = strategy.compute_loss(
        jax.tree.map(jnp.asarray, student), jax.tree.map(jnp.asarray, teacher),
        {"targets": jnp.asarray(targets), "mask": jnp.asarray(mask),
         distill.STEP_KEY: jnp.asarray(step)})
    kl = _numpy_kl(teacher["logits"], student["logits"], mask, 2.0)
    logp = np.take_along_axis(_log_softmax(student["logits"].astype(
        np.float64)), targets[..., None], -1)[..., 0]
    ce = -(logp * mask).sum() / mask.sum()
    s, t = (x["features"].astype(np.float64) for x in (student, teacher))
    if kind == "cosine":
      per_token = 1 - (s * t).sum(-1) / (np.linalg.norm(s, axis=-1) *
                                         np.linalg.norm(t, axis=-1))
    else:
      per_token = ((s - t) ** 2).mean(-1)
    features = np.mean([(p * mask).sum() / mask.sum() for p in per_token])
    want = 0.5 * 4.0 * kl + 0.5 * ce + 0.5 * features
    self.assertAlmostEqual(float(metrics["distill/alpha"]), 0.5, places=6)
    self.assertAlmostEqual(float(metrics["distill/kl"]), kl, places=5)
    self.assertAlmostEqual(float(metrics["distill/feature"]), features,
                           places=5)
    self.assertAlmostEqual(float(loss), want, places=4)

  def test_schedules(self):
    values = [float(distill.schedule_value(1.0, 0.0, kind, step, 5))
              for kind in ("constant", "linear", "cosine") for step in
              (0, 2, 4)]
    np.testing.assert_allclose(values, [1, 1, 1, 1, 0.5, 0, 1, 0.5, 0],
                               atol=1e-6)


class FeatureCaptureTest(absltest.TestCase):

  def test_features_are_the_blocks_outputs(self):
    # DeepSeek-V3: layer 0 is a dense block, layer 2 the second expert
    # block; the model also has a prediction depth.
    cfg = dataclasses.replace(
        tiny_configs.tiny_model_config("deepseek3", window=4),
        scan_layers=False)
    model = adapter.TunixModel(registry.create_model(cfg,
                                                     rngs=nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 8)))
    positions = jnp.broadcast_to(jnp.arange(8), tokens.shape)
    want_logits, _ = model(tokens, positions)
    decoder = model.model
    rotary = cfg.rope.global_rotary(positions, cfg.attention.head_dim)
    x = decoder.embedder(tokens)
    want = []
    for block in (*decoder.dense_blocks, *decoder.blocks):
      x = block(x, rotary, window=None, segment_ids_BL=None)[0]
      want.append(x)
    distill._capture(model, [0, 2])
    with warnings.catch_warnings():
      warnings.filterwarnings("error", message=".*sow.*",
                              category=DeprecationWarning)
      output = distill._forward_fn([0, 2])(model, tokens, positions)
    trees.assert_close(output["logits"], want_logits, rtol=1e-5, atol=1e-5,
                       scaled_atol=1e-5)
    trees.assert_close(output["features"], np.stack([want[0], want[2]]),
                       rtol=1e-5, atol=1e-5, scaled_atol=1e-5)


class DistillRunTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.folder = self.create_tempdir().full_path
    os.makedirs(os.path.join(self.folder, "teacher"))
    self.teacher = pt.write_checkpoint(os.path.join(self.folder, "teacher"),
                                       "llama3", seed=1)
    self.student = pt.write_checkpoint(self.folder, "qwen3", seed=2)
    self.train = pt.write_jsonl(os.path.join(self.folder, "train.jsonl"),
                                pt.mapping_records(32))

  def _config(self, steps):
    config = pt.distill_test_config(self.folder, self.student, self.teacher,
                                    steps=steps, train_file=self.train)
    config.optimizer.learning_rate = 1e-2
    return config

  def _batch(self, config):
    data = sft.data_config(PosttrainConfig.from_config_dict(config),
                           self.folder)
    batches = pipeline.make_train_pipeline(data, batch_size=8,
                                           vocab_size=128)
    batch = next(iter(batches))
    batches.close()
    return batch

  def _logits(self, checkpoint, batch):
    model = params_checkpoint.model_from_params(
        *params_checkpoint.load_params(checkpoint))
    return np.asarray(model(jnp.asarray(batch["inputs"]),
                            jnp.asarray(batch["positions"]),
                            jnp.asarray(batch["segment_ids"])))

  def test_lowers_the_students_kl_to_the_teacher(self):
    config = self._config(15)
    config.distill.alpha = 1.0
    config.distill.alpha_end = 1.0
    config.distill.temperature = 1.0
    result = distill.run(config, os.path.join(self.folder, "work"))
    batch = self._batch(config)
    teacher = self._logits(self.teacher, batch)
    before = _numpy_kl(teacher, self._logits(self.student, batch),
                       batch["mask"])
    after = _numpy_kl(teacher, self._logits(result.exported["export"], batch),
                      batch["mask"])
    print(f"Distillation (qwen3 student, llama3 teacher): KL {before:.4f} ->"
          f" {after:.4f}")
    self.assertLess(after, before / 2)

  def test_alpha_zero_equals_sft(self):
    config = self._config(3)
    config.distill.alpha = config.distill.alpha_end = 0.0
    distilled = distill.run(config, os.path.join(self.folder, "distill"))
    sft_config = pt.sft_test_config(self.folder, self.student, steps=3,
                                    train_file=self.train)
    sft_config.optimizer.learning_rate = 1e-2
    tuned = sft.run(sft_config, os.path.join(self.folder, "sft"))
    got, want = (params_checkpoint.load_params(r.exported["export"])[1]
                 for r in (distilled, tuned))
    start = params_checkpoint.load_params(self.student)[1]
    # The two programs round apart, and Adam turns that into up to 6e-4 in
    # an element whose gradient is near 0; a distillation term left in
    # would change the whole update, as large as the update itself.
    for a, b, before in zip(jax.tree.leaves(got), jax.tree.leaves(want),
                            jax.tree.leaves(start), strict=True):
      a, b, before = (np.asarray(x, np.float64) for x in (a, b, before))
      update = np.linalg.norm(b - before)
      self.assertGreater(update, 0.0)
      self.assertLess(np.linalg.norm(a - b), 1e-2 * update)

  def test_quantized_teachers(self):
    tokens = jnp.asarray([[3, 14, 15, 92, 65, 35]], jnp.int32)
    float_teacher = base_model.load_model(self.teacher).model
    want, _ = float_teacher(tokens)
    original = np.asarray(float_teacher.model.blocks[0].mlp.up.kernel[...])
    for qtype, qvalue_dtype, bound in (("int8", jnp.int8, 0.1),
                                       ("nf4", jnp.uint4, 1.0)):
      teacher = base_model.load_model(self.teacher, quantize=qtype).model
      kernel = teacher.model.blocks[0].mlp.up.kernel
      self.assertIsInstance(kernel.array, qwix.QArray)
      self.assertEqual(kernel.array.qvalue.dtype, qvalue_dtype)
      if qtype == "nf4":
        pt.assert_nf4(self, kernel.array, original,
                      np.asarray(lora.dense(kernel)))
      got, _ = teacher(tokens)
      diff = float(jnp.abs(got - want).max())
      print(f"{qtype} teacher: max |logit diff| = {diff:.3g}")
      self.assertBetween(diff, 1e-6, bound)

  def test_nf4_teacher_is_distilled(self):
    """The student's KL to the NF4 teacher (its own logits) falls."""
    config = self._config(15)
    config.distill.update(alpha=1.0, alpha_end=1.0, temperature=1.0,
                          teacher_qtype="nf4")
    result = distill.run(config, os.path.join(self.folder, "nf4"))
    batch = self._batch(config)
    teacher = base_model.load_model(self.teacher, quantize="nf4").model.model
    teacher_logits = np.asarray(teacher(
        jnp.asarray(batch["inputs"]), jnp.asarray(batch["positions"]),
        jnp.asarray(batch["segment_ids"])))
    before = _numpy_kl(teacher_logits, self._logits(self.student, batch),
                       batch["mask"])
    after = _numpy_kl(teacher_logits,
                      self._logits(result.exported["export"], batch),
                      batch["mask"])
    print(f"Distillation from an NF4 teacher: KL {before:.4f} ->"
          f" {after:.4f}")
    self.assertLess(after, before / 2)

  def test_bad_feature_layers_are_named(self):
    config = self._config(1)
    config.distill.feature_layers = ((5, 0),)
    with self.assertRaisesRegex(ValueError,
                                r"pair \(5, 0\): the student has 2 layers"):
      distill.run(config, os.path.join(self.folder, "bad"))


if __name__ == "__main__":
  absltest.main()
