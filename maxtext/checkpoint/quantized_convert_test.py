"""Converting the official quantized checkpoints: FP8 DeepSeek-V3, V3.2
(its indexer included) and Qwen3-Next (its `-FP8` releases, fused Gated
DeltaNet projections included), MXFP4 GPT-OSS.

A tiny random model of each family is saved by transformers and rewritten in
the published quantized layout (`testing.quantized_checkpoints`: each scale
in another shard than its weight); `convert_ckpt`'s conversion must give the
logits of transformers' own dequantization of the same folder (it
dequantizes on CPU), and the export back to Hugging Face must hold exactly
its dequantized weights. The DeepSeek-V3 config names a multi-token
prediction layer that the weights lack, as transformers saves it: the
conversion goes on without it and says so.
"""

import os

from absl import logging
from absl.testing import absltest
from flax import nnx
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from maxtext.checkpoint import hf_convert
from maxtext.checkpoint import params_checkpoint
from testing import hf_reference
from testing import hf_tiny_models
from testing import quantized_checkpoints

_TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, 16))
_TOLERANCE = 1e-4


class QuantizedConversionTest(absltest.TestCase):

  def _check(self, family: str, method: str, **config_changes) -> None:
    hf_dir = self.create_tempdir().full_path
    hf_tiny_models.tiny_hf_model(family).save_pretrained(hf_dir)
    quantized = quantized_checkpoints.quantize_folder(hf_dir, method,
                                                      **config_changes)
    self.assertNotEmpty(quantized)
    # transformers dequantizes on CPU (the MXFP4 experts to bfloat16, which
    # holds FP4 values exactly); computed in float32 here, as ours.
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir).float().eval()
    with torch.no_grad():
      want_logits = reference(torch.tensor(_TOKENS)).logits.numpy()
    # Its dequantized weights as a plain checkpoint stores them.
    plain = type(reference)(reference.config).float()
    plain.load_state_dict(reference.state_dict())
    want_tensors = hf_reference.state_dict(plain)
    for scan_layers in (True, False):
      with self.subTest(scan_layers=scan_layers):
        ours = self.create_tempdir().full_path
        with self.assertLogs(level=logging.INFO) as logs:
          cfg = hf_convert.hf_to_orbax(hf_dir, ours, scan_layers=scan_layers)
        self.assertTrue(any(f"{method} checkpoint; dequantizing"
                            f" {len(quantized)} weights" in line
                            for line in logs.output), logs.output)
        cfg, params = params_checkpoint.load_converted(ours)
        model = params_checkpoint.model_from_params(cfg, params)
        logits = nnx.jit(lambda m, t: m(t))(model, jnp.asarray(_TOKENS))
        diff = float(np.abs(np.asarray(logits) - want_logits).max())
        print(f"{family} {method} scan_layers={scan_layers}: max |logit"
              f" diff| = {diff:.3g} (max |logit| "
              f"{np.abs(want_logits).max():.3g})")
        self.assertLessEqual(diff, _TOLERANCE)

        back = self.create_tempdir().full_path
        hf_convert.orbax_to_hf(ours, back)
        got = quantized_checkpoints.read_folder(back)
        self.assertEqual(sorted(got), sorted(want_tensors))
        for name, array in want_tensors.items():
          np.testing.assert_array_equal(got[name], array, err_msg=name)
    return cfg, logs.output

  def test_fp8_deepseek3_without_its_prediction_layer(self):
    cfg, logs = self._check("deepseek3", "fp8", num_nextn_predict_layers=1)
    self.assertEqual(cfg.mtp.layers, 0)
    self.assertTrue(any(
        "names 1 multi-token prediction layer(s), but the weights hold none"
        in line for line in logs), logs)

  def test_fp8_deepseek3_2(self):
    self._check("deepseek3_2", "fp8")

  def test_fp8_qwen3_next(self):
    self._check("qwen3_next", "fp8")

  def test_mxfp4_gpt_oss(self):
    self._check("gpt_oss", "mxfp4")


if __name__ == "__main__":
  absltest.main()
