"""A real checkpoint: SmolLM2-135M-Instruct (Llama architecture).

The bundled GGUF Q4_1 file is dequantised by transformers into a float32
model, saved as safetensors, converted with our converter and run by our
model on a real chat prompt. Both sides compute with the same dequantised
float32 weights, so they differ only by float32 rounding in a different
order of operations: over 30 layers that is ~1e-5 relative to the logit
scale. The bound, 1e-4 * max |logit|, is 10x that; a wrong weight layout or
rotary setting gives differences of the order of the logits themselves.
"""

import os

from absl.testing import absltest
from flax import nnx
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from maxtext.checkpoint import hf_convert
from maxtext.checkpoint import params_checkpoint
from maxtext.common import bundled

_PROMPT = "The capital of France is"


class SmolLM2Test(absltest.TestCase):

  def test_logits_match_transformers(self):
    # The bundled GGUF file (outside Bazel, downloaded once).
    path = bundled.path("smollm2")
    folder, name = os.path.split(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder,
                                                           gguf_file=name)
    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (its GGUF quantizer is not
    # serialisable) although its weights are dequantised: copy them into a
    # plain model of the same config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
      del config.quantization_config
    hf_model = type(gguf_model)(config).float().eval()
    hf_model.load_state_dict(gguf_model.state_dict())
    del gguf_model
    hf_dir = self.create_tempdir().full_path
    hf_model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    ids = tokenizer(_PROMPT, return_tensors="np")["input_ids"]
    with torch.no_grad():
      want = hf_model(torch.tensor(ids)).logits.numpy()
    del hf_model

    ours_dir = self.create_tempdir().full_path
    cfg = hf_convert.hf_to_orbax(hf_dir, ours_dir)
    self.assertEqual((cfg.family, cfg.num_layers, cfg.vocab_size),
                     ("llama3", 30, 49152))
    self.assertTrue(os.path.exists(os.path.join(ours_dir, "tokenizer.json")))
    cfg, params = params_checkpoint.load_converted(ours_dir)
    model = params_checkpoint.model_from_params(cfg, params)
    got = np.asarray(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(ids)))

    scale = float(np.abs(want).max())
    diff = float(np.abs(got - want).max())
    print(f"SmolLM2-135M: {ids.shape[1]} tokens, max |logit diff| = "
          f"{diff:.3g}, max |logit| = {scale:.3g}, relative "
          f"{diff / scale:.3g}; next token ours "
          f"{tokenizer.decode(got[0, -1].argmax())!r}, transformers "
          f"{tokenizer.decode(want[0, -1].argmax())!r}")
    self.assertLessEqual(diff, 1e-4 * scale)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


if __name__ == "__main__":
  absltest.main()
