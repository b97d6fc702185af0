"""Tests of the attention layer: causality, window, segments, kernels."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax.numpy as jnp
import numpy as np

from maxtext.kernels import attention as attention_kernels
from maxtext.kernels import dispatch
from maxtext.layers import attention
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import norm
from maxtext.layers import rope
from testing import trees

_L = 12
_CFG = attention.AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=8,
                                 qk_norm=True, query_pre_attn_scalar=4.0)


def _run(layer, x, window=None, segment_ids=None):
  positions = np.broadcast_to(np.arange(_L), x.shape[:2])
  rotary = rope.Rotary.at(positions, rope.inverse_frequencies(8, 10_000.0))
  return np.asarray(layer(jnp.asarray(x), rotary, window=window,
                          segment_ids_BL=segment_ids))


def _layer(impl="reference", **changes):
  return attention.Attention(
      dataclasses.replace(_CFG, **changes), embed_dim=16,
      norm_config=norm.NormConfig(offset=1.0), dtype="float32",
      param_dtype="float32", kernel=dispatch.Kernel(impl=impl),
      rngs=nnx.Rngs(0))


def _x(seed=0):
  return np.random.RandomState(seed).normal(size=(2, _L, 16)).astype(
      np.float32)


class AttentionLayerTest(parameterized.TestCase):

  def test_future_tokens_have_no_influence(self):
    layer, x = _layer(), _x()
    changed = x.copy()
    changed[:, 7:] += 3.0
    out, out_changed = _run(layer, x), _run(layer, changed)
    np.testing.assert_array_equal(out[:, :7], out_changed[:, :7])
    self.assertGreater(np.abs(out[:, 7:] - out_changed[:, 7:]).max(), 1e-3)

  @parameterized.parameters("reference", "xla")
  def test_tokens_beyond_the_window_have_no_influence(self, impl):
    layer, x, window = _layer(impl), _x(), 4
    changed = x.copy()
    changed[:, :_L - window] += 3.0  # Only the last query cannot see these.
    out = _run(layer, x, window)
    out_changed = _run(layer, changed, window)
    np.testing.assert_array_equal(out[:, -1], out_changed[:, -1])
    # Without the window the last query does see them.
    self.assertGreater(
        np.abs(_run(layer, x)[:, -1] - _run(layer, changed)[:, -1]).max(),
        1e-3)

  def test_other_segments_have_no_influence(self):
    layer, x = _layer(), _x()
    segment_ids = np.array([[1] * 5 + [2] * 7, [1] * 12])
    changed = x.copy()
    changed[0, :5] += 3.0
    out = _run(layer, x, segment_ids=segment_ids)
    out_changed = _run(layer, changed, segment_ids=segment_ids)
    np.testing.assert_array_equal(out[0, 5:], out_changed[0, 5:])
    np.testing.assert_array_equal(out[1], out_changed[1])

  @parameterized.parameters(None, 5)
  def test_kernels_agree(self, window):
    x = _x(1)
    segment_ids = np.array([[1] * 6 + [2] * 6, [3] * 12])
    want = _run(_layer("reference"), x, window, segment_ids)
    got = _run(_layer("xla"), x, window, segment_ids)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_parameter_axis_names(self):
    names = {
        "/".join(map(str, path)): variable.get_metadata()["out_sharding"]
        for path, variable in nnx.to_flat_state(
            nnx.state(_layer(), nnx.Param))
    }
    self.assertEqual(names, {
        "query/kernel": ("embed", "heads", "head_dim"),
        "key/kernel": ("embed", "kv_heads", "head_dim"),
        "value/kernel": ("embed", "kv_heads", "head_dim"),
        "output/kernel": ("heads", "head_dim", "embed"),
        "query_norm/scale": ("head_dim",),
        "key_norm/scale": ("head_dim",),
    })

  def test_qkv_bias_is_on_query_key_value_only(self):
    layer = _layer(qkv_bias=True)
    self.assertEqual(layer.query.bias.shape, (4, 8))
    self.assertEqual(layer.key.bias.get_metadata()["out_sharding"],
                     ("kv_heads", "head_dim"))
    self.assertEqual(layer.value.bias.shape, (2, 8))
    self.assertIsNone(layer.output.bias)
    # A value bias shifts every output by the same vector (probabilities sum
    # to one), so the output changes by output(bias) at every position.
    without = _run(layer, _x())
    layer.value.bias[...] = np.ones((2, 8), np.float32)
    shift = _run(layer, _x()) - without
    trees.assert_close(shift, np.broadcast_to(shift[:1, :1], shift.shape),
                       rtol=1e-5, scaled_atol=1e-5)
    self.assertGreater(np.abs(shift).max(), 1e-3)

  def test_output_bias_adds_to_every_position(self):
    layer = _layer(output_bias=True)
    self.assertEqual(layer.output.bias.get_metadata()["out_sharding"],
                     ("embed",))
    without = _run(layer, _x())
    bias = np.arange(16, dtype=np.float32)
    layer.output.bias[...] = bias
    trees.assert_close(_run(layer, _x()) - without,
                       np.broadcast_to(bias, without.shape), rtol=1e-5,
                       scaled_atol=1e-5)

  def test_sinks_reach_the_kernel(self):
    layer = _layer(sinks=True)
    self.assertEqual(layer.sinks.get_metadata()["out_sharding"], ("heads",))
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    layer.sinks[...] = sinks
    x = _x()
    positions = np.broadcast_to(np.arange(_L), x.shape[:2])
    rotary = rope.Rotary.at(positions, rope.inverse_frequencies(8, 10_000.0))
    q = layer.query_norm(layer.query(x))
    k = layer.key_norm(layer.key(x))
    o = attention_kernels.reference_attention(
        rotary.apply(q), rotary.apply(k), layer.value(x), scale=0.5,
        window=5, sinks_H=sinks)
    trees.assert_close(_run(layer, x, window=5), layer.output(o),
                       rtol=1e-5, scaled_atol=1e-5)
    layer.sinks[...] = np.zeros(4, np.float32)
    self.assertGreater(np.abs(_run(layer, x, window=5) - layer.output(o))
                       .max(), 1e-3)

  def test_sinks_apply_when_decoding(self):
    """Prefill then one token at a time over a KV cache equals one pass."""
    layer = _layer(sinks=True)
    layer.sinks[...] = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    x = _x()
    want = _run(layer, x, window=5)
    cache = kv_cache_lib.KVCache.zeros(2, _L, 2, 8, jnp.float32)
    inv_freq = rope.inverse_frequencies(8, 10_000.0)
    outputs = []
    for start, stop in ((0, 7),) + tuple((i, i + 1) for i in range(7, _L)):
      positions = np.broadcast_to(np.arange(start, stop), (2, stop - start))
      out, cache = layer(jnp.asarray(x[:, start:stop]),
                         rope.Rotary.at(positions, inv_freq), window=5,
                         cache=cache, positions_BL=jnp.asarray(positions))
      outputs.append(np.asarray(out))
    trees.assert_close(np.concatenate(outputs, 1), want, rtol=1e-5,
                       scaled_atol=1e-5)


if __name__ == "__main__":
  absltest.main()
