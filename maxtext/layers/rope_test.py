"""Tests of rotary embeddings against Hugging Face transformers."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama import modeling_llama

from maxtext.layers import rope

_HEAD_DIM = 64
_LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
               high_freq_factor=4.0, original_max_position_embeddings=8192)


def _hf_inverse_frequencies(rope_parameters):
  config = transformers.LlamaConfig(
      hidden_size=_HEAD_DIM * 4, num_attention_heads=4, head_dim=_HEAD_DIM,
      max_position_embeddings=131_072, rope_parameters=rope_parameters)
  kind = rope_parameters["rope_type"]
  if kind == "default":
    init = modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters
  else:
    init = ROPE_INIT_FUNCTIONS[kind]
  inv_freq, attention_factor = init(config)
  assert attention_factor == 1.0
  return inv_freq.numpy()


class RopeTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("default", dict(rope_type="default", rope_theta=10_000.0), {}),
      ("linear", dict(rope_type="linear", factor=8.0, rope_theta=1e6),
       dict(scaling="linear", factor=8.0)),
      ("llama3", dict(**_LLAMA3, rope_theta=500_000.0),
       dict(scaling="llama3", factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_length=8192)),
  )
  def test_inverse_frequencies_match_hugging_face(self, hf_params, ours):
    want = _hf_inverse_frequencies(hf_params)
    got = rope.inverse_frequencies(_HEAD_DIM, hf_params["rope_theta"], **ours)
    np.testing.assert_allclose(got, want, rtol=1e-6)

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
    got = rope.Rotary.at(positions, inv_freq).apply(q)

    angles = positions[..., None] * inv_freq.astype(np.float32)
    cos = torch.tensor(np.cos(np.concatenate([angles, angles], -1)))
    sin = torch.tensor(np.sin(np.concatenate([angles, angles], -1)))
    q_hf = torch.tensor(q).transpose(1, 2)  # HF layout [B, H, L, K].
    want, _ = modeling_llama.apply_rotary_pos_emb(q_hf, q_hf, cos, sin)
    np.testing.assert_allclose(got, want.transpose(1, 2).numpy(), atol=1e-5)

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
