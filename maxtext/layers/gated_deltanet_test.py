"""Gated DeltaNet layer: its convolution against numpy's; decoding with its
cache (a padded prompt, then one token at a time) equals running the whole
sequence; packed documents equal separate rows; config errors."""

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.layers import gated_deltanet
from testing import trees

_CFG = gated_deltanet.LinearAttentionConfig(
    num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=6,
    conv_taps=4)


def _layer(chunk=4):
  return gated_deltanet.GatedDeltaNet(
      _CFG, embed_dim=16, norm_eps=1e-6, dtype="float32",
      param_dtype="float32", kernel=dispatch.Kernel(linear_chunk=chunk),
      rngs=nnx.Rngs(0))


class CausalConvTest(absltest.TestCase):

  def test_equals_numpy_with_segments(self):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 9, 2, 3)).astype(np.float32)
    w = rng.normal(size=(2, 3, 4)).astype(np.float32)
    segments = np.array([[0] * 4 + [1] * 5, [0] * 9])
    want = np.zeros_like(x)
    for b in range(2):
      for t in range(9):
        for tap in range(4):
          s = t - 3 + tap
          if s >= 0 and segments[b, s] == segments[b, t]:
            want[b, t] += w[..., tap] * x[b, s]
    want = want / (1 + np.exp(-want))
    got = gated_deltanet.causal_conv(jnp.asarray(x), jnp.asarray(w),
                                     segment_ids_BL=jnp.asarray(segments))
    np.testing.assert_allclose(got, want, atol=1e-5)


class GatedDeltaNetTest(absltest.TestCase):

  def test_decoding_equals_the_whole_sequence(self):
    layer = _layer()
    x = jax.random.normal(jax.random.key(1), (2, 11, 16))
    whole = layer(x)
    # Row 0's prompt has 6 tokens, row 1's 3 (then padding to 6).
    lengths = np.array([6, 3])
    prompt = x[:, :6]
    valid = jnp.arange(6)[None] < lengths[:, None]
    cache = gated_deltanet.DeltaNetCache.zeros(_CFG, 2, jnp.float32)
    out, cache = layer(prompt, cache=cache, valid_BL=valid)
    trees.assert_close(out[0], whole[0, :6], rtol=1e-5, scaled_atol=1e-5)
    trees.assert_close(out[1, :3], whole[1, :3], rtol=1e-5, scaled_atol=1e-5)
    position = lengths.copy()
    for _ in range(4):
      token = x[np.arange(2), position][:, None]
      out, cache = layer(token, cache=cache)
      trees.assert_close(out[:, 0], whole[np.arange(2), position],
                         rtol=1e-5, scaled_atol=1e-5)
      position += 1

  def test_packed_documents_equal_separate_rows(self):
    layer = _layer(chunk=8)
    x = jax.random.normal(jax.random.key(2), (1, 12, 16))
    segments = jnp.array([[1] * 5 + [2] * 7])
    packed = layer(x, segment_ids_BL=segments)
    trees.assert_close(packed[:, :5], layer(x[:, :5]), rtol=1e-5,
                       scaled_atol=1e-5)
    trees.assert_close(packed[:, 5:], layer(x[:, 5:]), rtol=1e-5,
                       scaled_atol=1e-5)

  def test_config_errors_name_the_key(self):
    with self.assertRaisesRegex(ValueError, "linear_num_value_heads=6"):
      gated_deltanet.LinearAttentionConfig(num_key_heads=4, num_value_heads=6)
    with self.assertRaisesRegex(ValueError, "linear_conv_taps=0"):
      gated_deltanet.LinearAttentionConfig(conv_taps=0)
    with self.assertRaisesRegex(ValueError, "sliding_window=8"):
      ModelConfig.from_dict(dict(
          family="qwen3_next", vocab_size=8, num_layers=2, embed_dim=8,
          mlp_dim=8, num_heads=2, num_kv_heads=1, head_dim=4,
          linear_num_key_heads=1, linear_num_value_heads=1,
          sliding_window=8, global_layer_interval=2))


if __name__ == "__main__":
  absltest.main()
