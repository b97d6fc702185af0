"""A training checkpoint exports to Hugging Face; checkpoint path errors."""

import json
import os
import shutil
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from configs import deepseek3
from configs import llama3
from maxtext.checkpoint import hf_convert
from maxtext.checkpoint import integrity
from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.checkpoint import params_checkpoint
from maxtext.layers import moe
from maxtext.trainers import pretrain
from maxtext.trainers.config import ExperimentConfig
from testing import trees

_TOKENS = np.random.RandomState(0).randint(0, 256, size=(2, 12))
_GROUP_BYTES = params_checkpoint._RESTORE_GROUP_BYTES  # pylint: disable=protected-access


def _tiny_config(*, scan_layers: bool):
  """The real llama3 config, shrunk to train 2 steps in seconds."""
  config = llama3.get_config()
  config.model.update(dict(vocab_size=256, num_layers=2, embed_dim=32,
                           mlp_dim=64, num_heads=4, num_kv_heads=2,
                           head_dim=8, scan_layers=scan_layers))
  config.data.source = "synthetic"
  config.data.seq_len = 16
  config.train.steps = 2
  config.train.batch_size = 2
  config.optimizer.warmup_steps = 1
  config.checkpoint.every_steps = 1
  config.checkpoint.async_save = False
  config.logging.every_steps = 1
  config.logging.tensorboard = False
  return config


class TrainingCheckpointTest(parameterized.TestCase):

  @parameterized.parameters(True, False)
  def test_exports_to_hugging_face(self, scan_layers):
    workdir = self.create_tempdir().full_path
    result = pretrain.train(_tiny_config(scan_layers=scan_layers), workdir)
    ours = nnx.jit(lambda m, t: m(t))(result.state.model(),
                                      jnp.asarray(_TOKENS))
    step_dir = os.path.join(workdir, "checkpoints", "2")
    cfg, params = params_checkpoint.load_params(step_dir)
    self.assertEqual((cfg.family, cfg.scan_layers), ("llama3", scan_layers))
    # The restored parameters are the trained ones.
    np.testing.assert_array_equal(
        np.asarray(params["final_norm"]["scale"]),
        np.asarray(result.state.params["final_norm"]["scale"]))

    # Restored an array per Orbax call, the same values; lazy parameters
    # read them as numpy when indexed, or at once when the model is one
    # restore group (this one, by default).
    for group_bytes in (1, _GROUP_BYTES):
      with mock.patch.object(params_checkpoint, "_RESTORE_GROUP_BYTES",
                             group_bytes):
        _, lazy = params_checkpoint.load_params(step_dir, lazy=True)
        _, eager = params_checkpoint.load_params(step_dir)
      jax.tree.map(np.testing.assert_array_equal, eager, params)
      for got, want in zip(jax.tree.leaves(lazy), jax.tree.leaves(params)):
        self.assertIsInstance(
            got,
            params_checkpoint.LazyParam if group_bytes == 1 else np.ndarray)
        self.assertEqual((got.shape, got.dtype), (want.shape, want.dtype))
        np.testing.assert_array_equal(got[...], np.asarray(want))

    # A step folder and the workdir (latest step) both export.
    for checkpoint in (step_dir, workdir):
      out = self.create_tempdir().full_path
      hf_convert.orbax_to_hf(checkpoint, out)
      hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
      with torch.no_grad():
        want = hf_model(torch.tensor(_TOKENS)).logits.numpy()
      diff = float(np.abs(np.asarray(ours) - want).max())
      print(f"training checkpoint scan_layers={scan_layers}: max |logit "
            f"diff| = {diff:.3g} (max |logit| {np.abs(want).max():.3g})")
      self.assertLessEqual(diff, 1e-4)

  def test_non_trained_variables_travel_with_the_parameters(self):
    # DeepSeek-V3's router bias is model state, moved by the train step.
    config = _tiny_config(scan_layers=True)
    config.model = deepseek3.get_config("tiny").model
    config.model.update(dict(vocab_size=256, num_layers=2, embed_dim=32,
                             mlp_dim=64, moe_mlp_dim=16, mtp_layers=0,
                             router_bias_update_rate=0.1))
    workdir = self.create_tempdir().full_path
    result = pretrain.train(config, workdir)
    want = nnx.to_pure_dict(nnx.state(result.state.model(), moe.RouterBias))
    self.assertGreater(float(np.abs(jax.tree.leaves(want)[0]).max()), 0.0)
    cfg, weights = params_checkpoint.load_params(workdir)
    restored = params_checkpoint.model_from_params(cfg, weights)
    got = nnx.to_pure_dict(nnx.state(restored, moe.RouterBias))
    jax.tree.map(np.testing.assert_array_equal, got, want)
    # A converted checkpoint keeps it too.
    out = self.create_tempdir().full_path
    params_checkpoint.save_converted(out, cfg, weights)
    _, converted = params_checkpoint.load_params(out)
    jax.tree.map(np.testing.assert_array_equal, converted, weights)

  def test_checkpoints_written_before_execution_left_the_model(self):
    # Written by the code whose model section held attention_impl, remat_*
    # and pipeline_* (testdata/before_execution/README.md): they load, and
    # the workdir resumes as if never interrupted.
    fixtures = os.path.join(os.path.dirname(__file__), "testdata",
                            "before_execution")
    workdir = os.path.join(self.create_tempdir().full_path, "workdir")
    shutil.copytree(os.path.join(fixtures, "workdir"), workdir)
    cfg, params = params_checkpoint.load_params(workdir)
    converted_cfg, converted = params_checkpoint.load_params(
        os.path.join(fixtures, "converted"))
    config = _tiny_config(scan_layers=True)
    self.assertEqual(cfg, ExperimentConfig.from_config_dict(config).model)
    self.assertEqual(converted_cfg, cfg)
    jax.tree.map(np.testing.assert_array_equal, converted, params)

    config.remat.policy = "full"  # What the fixture's run used.
    config.attention_kernel.update(impl="blockwise", block_q=8, block_kv=8)
    resumed = pretrain.train(config, workdir)
    uninterrupted = pretrain.train(config, self.create_tempdir().full_path)
    self.assertEqual(resumed.step, 2)
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      steps = [json.loads(line)["step"] for line in f]
    self.assertEqual(sorted(set(steps)), [1, 2])  # Step 1 was not redone.
    self.assertEqual(steps.count(1), 2)  # Its train and goodput lines.
    # The fixture's step 1 ran on another machine: rounding differences in
    # its gradients, which Adam's normalisation enlarges where a gradient is
    # near zero, reach a few 1e-6 (or 1e-5 of a leaf's largest magnitude,
    # where summed in another order). A lost optimizer state or a redone
    # step moves parameters by about the learning rate (1e-3).
    trees.assert_trees_close(resumed.state.params, uninterrupted.state.params,
                             rtol=0, atol=1e-5, scaled_atol=1e-5)

  def test_not_a_checkpoint(self):
    folder = self.create_tempdir().full_path
    with self.assertRaisesRegex(params_checkpoint.ParamsCheckpointError,
                                f"{folder} is not a checkpoint"):
      params_checkpoint.load_params(folder)

  def test_training_checkpoint_without_workdir_config(self):
    step_dir = os.path.join(self.create_tempdir().full_path, "checkpoints",
                            "3")
    os.makedirs(os.path.join(step_dir, "state"))
    with open(os.path.join(step_dir, "state", "_METADATA"), "w") as f:
      f.write("{}")
    integrity.write_manifest(step_dir)  # Intact; only the config is missing.
    with self.assertRaisesRegex(params_checkpoint.ParamsCheckpointError,
                                r"config.json does not exist"):
      params_checkpoint.load_params(step_dir)

  def test_converted_checkpoint_without_params(self):
    folder = self.create_tempdir()
    folder.create_file("model_config.json", content='{"family": "llama3"}')
    with self.assertRaisesRegex(params_checkpoint.ParamsCheckpointError,
                                "model_config.json: invalid model config"):
      params_checkpoint.load_params(folder.full_path)

  def test_readers_verify_like_train_and_fall_back_to_older_steps(self):
    workdir = self.create_tempdir().full_path
    config = _tiny_config(scan_layers=True)
    result = pretrain.train(config, workdir)
    checkpoints = os.path.join(workdir, "checkpoints")
    step = {s: os.path.join(checkpoints, str(s)) for s in (1, 2, 3)}
    _, want1 = params_checkpoint.load_params(step[1])
    _, want2 = params_checkpoint.load_params(step[2])

    # Each step's model config and tokenizer are those of the run that
    # saved it: a run resumed at step 1 with a changed config saved step 2.
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      resumed = json.load(f)
    resumed["model"]["dtype"] = "bfloat16"
    resumed["data"]["tokenizer"] = "/resumed/tokenizer.json"
    with open(os.path.join(workdir, "config_step1.json"), "w",
              encoding="utf-8") as f:
      json.dump(resumed, f)
    self.assertEqual(params_checkpoint.load_params(step[1])[0].dtype,
                     "float32")
    self.assertEqual(params_checkpoint.load_params(step[2])[0].dtype,
                     "bfloat16")
    self.assertEqual(params_checkpoint.tokenizer_path(step[2]),
                     "/resumed/tokenizer.json")
    self.assertIsNone(params_checkpoint.tokenizer_path(step[1]))
    # The workdir's is its newest checkpoint's, as `load_params` reads it.
    self.assertEqual(params_checkpoint.tokenizer_path(workdir),
                     "/resumed/tokenizer.json")
    os.remove(os.path.join(workdir, "config_step1.json"))

    # Step 3 as a run without the state check could have saved it: NaN
    # parameters, its manifest intact.
    checkpointer = checkpoint_lib.Checkpointer(
        checkpoints, max_to_keep=5, async_save=False)
    tree, data_state = checkpointer.restore(result.state.checkpoint_tree(), 2)
    tree["params"] = jax.tree.map(lambda x: x * jnp.nan, tree["params"])
    checkpointer.save(3, tree, data_state)
    checkpointer.close()
    # Step 2 with one byte flipped.
    state_files = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(os.path.join(step[2], "state"))
        for name in names if name != "_CHECKPOINT_METADATA")
    biggest = max(state_files, key=os.path.getsize)
    with open(biggest, "r+b") as f:
      byte = f.read(1)
      f.seek(0)
      f.write(bytes([byte[0] ^ 1]))

    with self.assertRaisesRegex(params_checkpoint.ParamsCheckpointError,
                                "Parameter .* holds NaN or infinite"):
      params_checkpoint.load_params(step[3])
    # Lazily, when a parameter is read (the whole model at once, when it is
    # one restore group).
    with mock.patch.object(params_checkpoint, "_RESTORE_GROUP_BYTES", 1):
      _, lazy = params_checkpoint.load_params(step[3], lazy=True)
    with self.assertRaisesRegex(params_checkpoint.ParamsCheckpointError,
                                f"in {step[3]}/state holds NaN"):
      jax.tree.leaves(lazy)[0][...]
    with self.assertRaisesRegex(params_checkpoint.ParamsCheckpointError,
                                f"in {step[3]}/state holds NaN"):
      params_checkpoint.load_params(step[3], lazy=True)
    with self.assertRaisesRegex(
        params_checkpoint.ParamsCheckpointError,
        f"Checkpoint {step[2]} is corrupt: state/.* SHA-256 differs"):
      params_checkpoint.load_params(step[2])
    # The workdir reads as step 1, naming what it passed over, and is left
    # as it was (a reader renames nothing).
    with self.assertLogs(level="WARNING") as logs:
      _, got = params_checkpoint.load_params(workdir)
    jax.tree.map(np.testing.assert_array_equal, got, want1)
    self.assertFalse(jax.tree.all(jax.tree.map(np.array_equal, got, want2)))
    logged = "\n".join(logs.output)
    self.assertIn(f"Checkpoint {step[2]} is corrupt", logged)
    self.assertIn("holds NaN", logged)
    self.assertEqual(sorted(os.listdir(checkpoints)), ["1", "2", "3"])

    # An export of the corrupt step fails before writing anything.
    out = os.path.join(self.create_tempdir().full_path, "hf")
    with self.assertRaisesRegex(hf_convert.ConversionError,
                                f"Checkpoint {step[2]} is corrupt"):
      hf_convert.orbax_to_hf(step[2], out)
    self.assertFalse(os.path.exists(out))
    # No step usable: one error naming each.
    os.remove(os.path.join(step[1], "maxtext_manifest.json"))
    with self.assertRaisesRegex(
        params_checkpoint.ParamsCheckpointError,
        f"No usable checkpoint in {checkpoints}: .*{step[3]}.*{step[2]} is"
        f" corrupt.*{step[1]} is corrupt: maxtext_manifest.json is missing"):
      params_checkpoint.load_params(workdir)

  def test_converted_checkpoints_are_verified(self):
    cfg, params = params_checkpoint.load_params(os.path.join(
        os.path.dirname(__file__), "testdata", "before_execution",
        "converted"))
    out = self.create_tempdir().full_path
    params_checkpoint.save_converted(out, cfg, params)
    self.assertEqual(params_checkpoint.load_params(out)[0], cfg)
    manifest = os.path.join(out, "params", "maxtext_manifest.json")
    with open(manifest, encoding="utf-8") as f:
      [name] = [n for n in json.load(f)["files"] if n.startswith("d/")][:1]
    with open(os.path.join(out, "params", name), "ab") as f:
      f.write(b"\0")
    with self.assertRaisesRegex(
        params_checkpoint.ParamsCheckpointError,
        f"Checkpoint {out}/params is corrupt: {name}: .* bytes, the manifest"
        " says"):
      params_checkpoint.load_params(out)


if __name__ == "__main__":
  absltest.main()
