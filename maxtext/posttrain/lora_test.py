"""Tests LoRA/QLoRA through a real SFT run on a tiny model: only the
adapters train, the merged export computes what the adapted model computes
(with an int8 or NF4 base, per column or in tiles: the NF4 base is the
QLoRA paper's code book times absmax scales, and the export is the
dequantized base plus the adapters), and the PEFT adapter rebuilds the
merged Hugging Face weights (and is refused for an adapter on part of a
fused Hugging Face weight)."""

import json
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax.numpy as jnp
import numpy as np
import qwix
from safetensors import numpy as safetensors_numpy

from maxtext.checkpoint import params_checkpoint
from maxtext.checkpoint import safetensors_io
from maxtext.models import hf_weights
from maxtext.models import registry
from maxtext.posttrain import base_model
from maxtext.posttrain import lora
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import sft
from testing import tiny_configs

_TOKENS = jnp.asarray([[3, 14, 15, 92, 65, 35, 89, 79]], jnp.int32)


def _run(folder: str, **lora_fields):
  ckpt = pt.write_checkpoint(folder)
  train = pt.write_jsonl(os.path.join(folder, "train.jsonl"),
                         pt.mapping_records(32))
  config = pt.sft_test_config(folder, ckpt, steps=8, train_file=train,
                              **lora_fields)
  config.optimizer.learning_rate = 3e-2
  config.export.peft_adapter = True
  return ckpt, sft.run(config, os.path.join(folder, "work"))


def _base_variables(model) -> dict:
  """{path: value} of every non-adapter parameter (quantized ones as their
  qwix arrays)."""
  state = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
  return {path: np.asarray(value) for path, value in
          nnx.to_flat_state(state)}


class LoraTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.ckpt, cls.result = _run(cls.folder, mode="lora", rank=4, alpha=8.0)
    cls.trained = cls.result.model.model.model

  def test_only_adapters_change(self):
    initial = base_model.load_model(
        self.ckpt, lora=lora.LoraConfig(mode="lora", rank=4, alpha=8.0),
        seed=0).model.model
    before, after = _base_variables(initial), _base_variables(self.trained)
    self.assertEqual(before.keys(), after.keys())
    for path in before:
      np.testing.assert_array_equal(after[path], before[path], str(path))
    query = self.trained.blocks[1].attention.query
    initial_query = initial.blocks[1].attention.query
    self.assertIsInstance(query.kernel_lora_a, nnx.LoRAParam)
    self.assertEqual(float(jnp.abs(initial_query.kernel_lora_b[...]).max()),
                     0.0)
    self.assertGreater(float(jnp.abs(query.kernel_lora_b[...]).max()), 0.0)
    self.assertFalse(np.array_equal(query.kernel_lora_a[...],
                                    initial_query.kernel_lora_a[...]))

  def test_merged_export_computes_the_adapted_model(self):
    cfg, params = params_checkpoint.load_params(
        self.result.exported["export"])
    self.assertTrue(cfg.scan_layers)  # The starting checkpoint's layout.
    merged = params_checkpoint.model_from_params(cfg, params)
    want, _ = self.result.model.model(_TOKENS)
    diff = float(jnp.abs(merged(_TOKENS) - want).max())
    print(f"LoRA merged vs adapted: max |logit diff| = {diff:.2g}")
    self.assertLess(diff, 1e-4)
    for name in ("tokenizer.json", "hf_config.json"):
      self.assertTrue(os.path.isfile(os.path.join(
          self.result.exported["export"], name)), name)

  def test_peft_adapter_rebuilds_the_merged_weights(self):
    folder = self.result.exported["peft_adapter"]
    with open(os.path.join(folder, lora.PEFT_CONFIG_FILENAME)) as f:
      adapter_config = json.load(f)
    self.assertEqual((adapter_config["r"], adapter_config["lora_alpha"]),
                     (4, 8.0))
    self.assertEqual(adapter_config["target_modules"],
                     ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                      "up_proj", "v_proj"])
    adapters = safetensors_numpy.load_file(
        os.path.join(folder, lora.PEFT_WEIGHTS_FILENAME))
    base = safetensors_io.open_weights(os.path.join(self.folder, "hf"))
    model = params_checkpoint.model_from_params(
        *params_checkpoint.load_params(self.result.exported["export"]))
    merged = hf_weights.to_hf_weights(model)
    scale = adapter_config["lora_alpha"] / adapter_config["r"]
    rebuilt = 0
    for name, weight in merged.items():
      prefix = "base_model.model." + name[:-len(".weight")]
      if prefix + ".lora_A.weight" in adapters:
        delta = (adapters[prefix + ".lora_B.weight"] @
                 adapters[prefix + ".lora_A.weight"]) * scale
        np.testing.assert_allclose(base[name] + delta, weight, atol=1e-5,
                                   err_msg=name)
        rebuilt += 1
      else:
        np.testing.assert_array_equal(base[name], weight, err_msg=name)
    self.assertEqual(rebuilt, 7 * 2)  # 7 projections in each of 2 layers.

  def test_unmatched_module_path_is_an_error(self):
    with self.assertRaisesRegex(ValueError,
                                r"matches no projection.*blocks/0/attention"):
      base_model.load_model(self.ckpt, lora=lora.LoraConfig(
          mode="lora", module_path="layers/.*"))


class QloraTest(parameterized.TestCase):

  @parameterized.parameters(dict(base_qtype="int8"), dict(base_qtype="nf4"),
                            dict(base_qtype="nf4", tile_size=16))
  def test_quantized_base_stays_frozen_and_merges(self, base_qtype,
                                                  tile_size=0):
    folder = self.create_tempdir().full_path
    fields = dict(mode="qlora", base_qtype=base_qtype, tile_size=tile_size,
                  rank=4, alpha=8.0)
    ckpt, result = _run(folder, **fields)
    trained = result.model.model.model
    up = trained.blocks[0].mlp.up
    self.assertIsInstance(up.kernel.array, qwix.QArray)
    self.assertEqual(up.kernel.array.qvalue.dtype,
                     jnp.int8 if base_qtype == "int8" else jnp.uint4)
    base = lora.dense(up.kernel)
    if base_qtype == "nf4":
      original = base_model.load_model(ckpt).model.model.blocks[0].mlp.up
      pt.assert_nf4(self, up.kernel.array, np.asarray(original.kernel[...]),
                    np.asarray(base))
      # One scale per column, per tile of 16 rows when tiled.
      rows = original.kernel[...].shape[0]
      self.assertEqual(up.kernel.array.scale.shape[0],
                       rows // tile_size if tile_size else 1)
    initial = base_model.load_model(ckpt, lora=lora.LoraConfig(
        **fields)).model.model
    before, after = _base_variables(initial), _base_variables(trained)
    for path in before:
      np.testing.assert_array_equal(after[path], before[path], str(path))
    self.assertGreater(float(jnp.abs(up.kernel_lora_b[...]).max()), 0)
    # The export's kernel is the dequantized base plus B A alpha / r.
    merged = base_model.load_model(result.exported["export"]).model.model
    np.testing.assert_allclose(
        merged.blocks[0].mlp.up.kernel[...],
        base + (up.kernel_lora_a[...] @ up.kernel_lora_b[...]) * 2.0,
        atol=1e-6)
    merged = params_checkpoint.model_from_params(
        *params_checkpoint.load_params(result.exported["export"]))
    want, _ = result.model.model(_TOKENS)
    diff = float(jnp.abs(merged(_TOKENS) - want).max())
    print(f"QLoRA {base_qtype} (tile {tile_size}) merged vs adapted: max"
          f" |logit diff| = {diff:.2g}")
    self.assertLess(diff, 1e-4)


class PeftExportTest(absltest.TestCase):

  def test_adapter_on_part_of_a_fused_weight_is_refused(self):
    """Qwen3-Next's Gated DeltaNet query is rows of the Hugging Face weight
    in_proj_qkvz: a PEFT adapter on it would adapt the whole weight."""
    cfg = tiny_configs.tiny_model_config("qwen3_next", window=4,
                                         scan_layers=False)
    config = lora.LoraConfig(mode="lora", rank=2,
                             module_path=r".*linear_attention/query")
    model = lora.apply_lora(
        registry.create_model(cfg, rngs=nnx.Rngs(0)), config, seed=0,
        example_tokens=jnp.arange(8)[None])
    with self.assertRaisesRegex(
        ValueError, r"linear_attention/query/kernel adapts only part of the"
        r" Hugging Face weight model\.layers\.0\.linear_attn\.in_proj_qkvz"
        r"\.weight"):
      lora.peft_adapter(model, cfg, config)


if __name__ == "__main__":
  absltest.main()
