"""Tests of multi-head latent attention (Hugging Face parity is in
`maxtext/models/deepseek3_test.py`)."""

import dataclasses
import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.kernels import dispatch
from maxtext.layers import attention
from maxtext.layers import mla
from maxtext.layers import rope
from testing import trees

_ATTENTION = attention.AttentionConfig(type="mla", num_heads=4,
                                       num_kv_heads=4, head_dim=8)
_CFG = mla.MlaConfig(q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=6,
                     v_head_dim=10, rope_interleave=True)
_ROPE = rope.RopeConfig(scaling="yarn", scaling_factor=4.0,
                        original_max_length=8, yarn_mscale=1.0,
                        yarn_mscale_all_dim=1.0)
_REFERENCE = dispatch.Kernel(impl="reference")
_B, _L, _D = 2, 7, 32


def _mla(cfg=_CFG):
  return mla.MLA(_ATTENTION, cfg, _ROPE, embed_dim=_D, dtype="float32",
                 param_dtype="float32", kernel=_REFERENCE, rngs=nnx.Rngs(0))


def _rotary(positions_BL):
  return _ROPE.global_rotary(positions_BL, _ATTENTION.head_dim)


def _inputs(seed=0):
  return jax.random.normal(jax.random.key(seed), (_B, _L, _D))


def _positions(length=_L, start=0):
  return jnp.broadcast_to(jnp.arange(start, start + length), (_B, length))


class MlaTest(parameterized.TestCase):

  @parameterized.parameters((16, True), (0, True), (16, False))
  def test_decoding_with_the_latent_cache_equals_the_forward_pass(
      self, q_lora_rank, interleave):
    cfg = dataclasses.replace(_CFG, q_lora_rank=q_lora_rank,
                              rope_interleave=interleave)
    layer = _mla(cfg)
    x_BLD = _inputs()
    want = layer(x_BLD, _rotary(_positions()))
    cache = mla.empty_cache(cfg, _ATTENTION.head_dim, "float32", _B, 16)
    # Cached: latents [B, S, 1, C] and rotary keys [B, S, 1, K] only.
    self.assertEqual(cache.key_BSGK.shape, (_B, 16, 1, 12))
    self.assertEqual(cache.value_BSGK.shape, (_B, 16, 1, 8))
    prompt = 4
    got, cache = layer(x_BLD[:, :prompt], _rotary(_positions(prompt)),
                       cache=cache, positions_BL=_positions(prompt))
    steps = [got]
    for i in range(prompt, _L):
      positions = _positions(1, i)
      out, cache = layer(x_BLD[:, i:i + 1], _rotary(positions),
                         cache=cache, positions_BL=positions)
      steps.append(out)
    trees.assert_close(jnp.concatenate(steps, axis=1), want, rtol=1e-5,
                       scaled_atol=1e-5)

  def test_interleaved_rotary_is_a_permutation_of_the_rotary_columns(self):
    # Rotating pairs (0, 1), (2, 3), ... equals the half-split rotation of
    # weights whose rotary columns are reordered evens-then-odds.
    split_cfg = dataclasses.replace(_CFG, rope_interleave=False)
    interleaved = _mla()
    split = _mla(split_cfg)
    nope, rot = _CFG.qk_nope_head_dim, _ATTENTION.head_dim
    order = np.concatenate([np.arange(0, rot, 2), np.arange(1, rot, 2)])
    q = np.array(split.query_up.kernel[...])
    q[..., nope:] = q[..., nope:][..., order]
    split.query_up.kernel[...] = q
    kv = np.array(split.kv_down.kernel[...])
    kv[:, 12:] = kv[:, 12:][:, order]
    split.kv_down.kernel[...] = kv
    x_BLD = _inputs()
    want = interleaved(x_BLD, _rotary(_positions()))
    got = split(x_BLD, _rotary(_positions()))
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    unpermuted = _mla(split_cfg)(
        x_BLD, _rotary(_positions()))
    self.assertGreater(np.abs(unpermuted - want).max(), 1e-3)

  def test_softmax_scale_has_yarn_mscale_squared(self):
    want = (6 + 8)**-0.5 * (0.1 * math.log(4.0) + 1)**2
    self.assertAlmostEqual(mla.softmax_scale(_ATTENTION, _CFG, _ROPE), want,
                           places=12)
    self.assertAlmostEqual(
        mla.softmax_scale(_ATTENTION, _CFG, rope.RopeConfig()), 14**-0.5,
        places=12)

  @parameterized.parameters("reference", "xla", "blockwise")
  def test_kernels_take_a_narrower_value_head(self, impl):
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 4, dim))
               for i, dim in ((0, 14), (1, 14), (2, 10)))
    got = dispatch.attention(q, k, v, impl=impl, scale=0.3)
    logits = np.einsum("blhk,bshk->bhls", q, k) * 0.3
    logits = np.where(np.tril(np.ones((5, 5), bool)), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.einsum("bhls,bshk->blhk", probs, v)
    self.assertEqual(got.shape, (2, 5, 4, 10))
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)


if __name__ == "__main__":
  absltest.main()
