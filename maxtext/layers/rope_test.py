"""Tests of rotary embeddings against Hugging Face transformers."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama import modeling_llama
from transformers.models.llama4 import modeling_llama4

from maxtext.layers import rope

_HEAD_DIM = 64
_LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
               high_freq_factor=4.0, original_max_position_embeddings=8192)


_YARN = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
             original_max_position_embeddings=4096)


def _hf_rope(rope_parameters):
  """Hugging Face's (inverse frequencies, attention factor)."""
  config = transformers.LlamaConfig(
      hidden_size=_HEAD_DIM * 4, num_attention_heads=4, head_dim=_HEAD_DIM,
      max_position_embeddings=131_072, rope_parameters=rope_parameters)
  kind = rope_parameters["rope_type"]
  if kind == "default":
    init = modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters
  else:
    init = ROPE_INIT_FUNCTIONS[kind]
  inv_freq, attention_factor = init(config)
  return inv_freq.numpy(), attention_factor


class RopeTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("default", dict(rope_type="default", rope_theta=10_000.0), {}),
      ("linear", dict(rope_type="linear", factor=8.0, rope_theta=1e6),
       dict(scaling="linear", factor=8.0)),
      ("llama3", dict(**_LLAMA3, rope_theta=500_000.0),
       dict(scaling="llama3", factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_length=8192)),
      # Llama 4 Scout: equal factors, no band to blend.
      ("llama3_equal_factors", dict(**{**_LLAMA3, "high_freq_factor": 1.0,
                                       "factor": 16.0},
                                    rope_theta=500_000.0),
       dict(scaling="llama3", factor=16.0, low_freq_factor=1.0,
            high_freq_factor=1.0, original_max_length=8192)),
      ("yarn_gpt_oss", dict(**_YARN, truncate=False, rope_theta=150_000.0),
       dict(scaling="yarn", factor=32.0, original_max_length=4096,
            truncate=False)),
      ("yarn_deepseek", dict(**_YARN, mscale=1.0, mscale_all_dim=1.0,
                             rope_theta=10_000.0),
       dict(scaling="yarn", factor=32.0, original_max_length=4096,
            mscale=1.0, mscale_all_dim=1.0)),
      ("yarn_mscales_differ", dict(**_YARN, mscale=0.707, mscale_all_dim=1.0,
                                   rope_theta=10_000.0),
       dict(scaling="yarn", factor=32.0, original_max_length=4096,
            mscale=0.707, mscale_all_dim=1.0)),
  )
  def test_inverse_frequencies_match_hugging_face(self, hf_params, ours):
    want, want_factor = _hf_rope(hf_params)
    mscales = {k: ours.pop(k) for k in ("mscale", "mscale_all_dim")
               if k in ours}
    got = rope.inverse_frequencies(_HEAD_DIM, hf_params["rope_theta"], **ours)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got_factor = rope.attention_factor(ours.get("scaling", "default"),
                                       ours.get("factor", 1.0), **mscales)
    self.assertAlmostEqual(got_factor, want_factor, places=6)

  def test_yarn_blends_between_kept_and_divided_frequencies(self):
    plain = rope.inverse_frequencies(_HEAD_DIM, 10_000.0)
    scaled = rope.inverse_frequencies(_HEAD_DIM, 10_000.0, "yarn", 32.0,
                                      original_max_length=4096)
    self.assertEqual(scaled[0], plain[0])  # Fast rotations: extrapolated.
    self.assertAlmostEqual(scaled[-1], plain[-1] / 32.0)  # Slow: divided.
    self.assertTrue(np.all(scaled <= plain))

  def test_llama3_scaling_keeps_short_and_divides_long_wavelengths(self):
    plain = rope.inverse_frequencies(_HEAD_DIM, 500_000.0)
    scaled = rope.inverse_frequencies(_HEAD_DIM, 500_000.0, "llama3", 8.0)
    wavelength = 2 * np.pi / plain
    short, long = wavelength < 8192 / 4, wavelength > 8192
    self.assertTrue(short.any() and long.any())
    np.testing.assert_array_equal(scaled[short], plain[short])
    np.testing.assert_allclose(scaled[long], plain[long] / 8.0)

  def test_apply_matches_hugging_face(self):
    rng = np.random.RandomState(0)
    positions = np.array([[0, 1, 2, 7, 100], [5, 6, 0, 1, 2]])
    q = rng.normal(size=(2, 5, 3, _HEAD_DIM)).astype(np.float32)
    inv_freq = rope.inverse_frequencies(_HEAD_DIM, 10_000.0)
    got = rope.Rotary.at(positions, inv_freq, scale=1.25).apply(q)

    angles = positions[..., None] * inv_freq.astype(np.float32)
    cos = torch.tensor(np.cos(np.concatenate([angles, angles], -1)) * 1.25)
    sin = torch.tensor(np.sin(np.concatenate([angles, angles], -1)) * 1.25)
    q_hf = torch.tensor(q).transpose(1, 2)  # HF layout [B, H, L, K].
    want, _ = modeling_llama.apply_rotary_pos_emb(q_hf, q_hf, cos, sin)
    np.testing.assert_allclose(got, want.transpose(1, 2).numpy(), atol=1e-5)

  def test_interleaved_apply_matches_llama4(self):
    """Llama 4 rotates pairs (2i, 2i + 1) as complex numbers."""
    rng = np.random.RandomState(0)
    positions = np.array([[0, 1, 2, 7, 100], [5, 6, 0, 1, 2]])
    q = rng.normal(size=(2, 5, 3, _HEAD_DIM)).astype(np.float32)
    inv_freq = rope.inverse_frequencies(_HEAD_DIM, 10_000.0)
    got = rope.Rotary.at(positions, inv_freq, interleaved=True).apply(q)
    angles = torch.tensor(positions[..., None] * inv_freq.astype(np.float32))
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    want, _ = modeling_llama4.apply_rotary_emb(torch.tensor(q),
                                               torch.tensor(q), freqs_cis)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)

  def test_scores_depend_only_on_relative_position(self):
    rng = np.random.RandomState(1)
    q = rng.normal(size=(1, 1, 1, _HEAD_DIM)).astype(np.float32)
    k = rng.normal(size=(1, 1, 1, _HEAD_DIM)).astype(np.float32)
    inv_freq = rope.inverse_frequencies(_HEAD_DIM, 10_000.0)

    def score(q_position, k_position):
      q_rot = rope.Rotary.at(np.array([[q_position]]), inv_freq).apply(q)
      k_rot = rope.Rotary.at(np.array([[k_position]]), inv_freq).apply(k)
      return float(np.sum(np.asarray(q_rot) * np.asarray(k_rot)))

    self.assertAlmostEqual(score(5, 2), score(13, 10), places=4)
    self.assertNotAlmostEqual(score(5, 2), score(5, 3), places=2)


if __name__ == "__main__":
  absltest.main()
