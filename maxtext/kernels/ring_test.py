"""Tests of ring attention on 8 fake CPU devices (JAX_NUM_CPU_DEVICES=8, set by
the Bazel target): output and gradients equal the reference on the unsharded
arrays, the compiled step rotates keys and values instead of all-gathering
them, and a tiny Llama with context_parallel="ring" on a sequence-split mesh
gives the single-device loss and gradients."""

import re

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import common
from configs import llama3
from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import attention
from maxtext.kernels import dispatch
from maxtext.kernels import kernel_testing
from maxtext.kernels import ring
from maxtext.models import execution
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import devices
from testing import trees

_B, _L, _K = 2, 32, 8
# The compute layout of the default rule tables (configs/common.py) for the
# axes attention uses.
_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", ("sequence",)),
    ("kv_length", ()),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("head_dim", ()),
)


def _rules(**ici):
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)),
      jax.devices()[:int(np.prod(list(ici.values())))])
  return rules_lib.LogicalRules(mesh, (), _RULES)


def _ring_value_and_grads(rules, q, k, v, sinks, **kwargs):
  with axes.activation_sharding(rules):
    return kernel_testing.value_and_grads(ring.ring_attention, q, k, v, sinks,
                                          **kwargs)


_CASES = [
    dict(testcase_name="causal", num_heads=4, num_kv_heads=4),
    dict(testcase_name="gqa", num_heads=4, num_kv_heads=2),
    dict(testcase_name="mqa", num_heads=4, num_kv_heads=1),
    dict(testcase_name="window_within_chunk", num_heads=4, num_kv_heads=2,
         window=5),
    dict(testcase_name="window_across_chunks", num_heads=4, num_kv_heads=2,
         window=13),
    dict(testcase_name="segments", num_heads=4, num_kv_heads=2,
         segments=True),
    dict(testcase_name="softcap", num_heads=4, num_kv_heads=2, softcap=2.0),
    dict(testcase_name="sinks", num_heads=4, num_kv_heads=2, sinks=True),
    dict(testcase_name="all", num_heads=4, num_kv_heads=1, window=11,
         segments=True, softcap=3.0, sinks=True),
]


class RingAttentionTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  def _check(self, rules, num_heads, num_kv_heads, window=None,
             segments=False, softcap=0.0, sinks=False, value_dim=_K,
             **blocks):
    q, k, v = kernel_testing.inputs(_B, _L, num_heads, num_kv_heads, _K,
                                    value_dim=value_dim)
    sinks_H = (np.linspace(-1.0, 2.0, num_heads).astype(np.float32)
               if sinks else None)
    kwargs = dict(
        scale=0.4, window=window, logit_softcap=softcap,
        segment_ids_BL=kernel_testing.segments(_B, _L) if segments else None)
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, sinks_H, **kwargs)
    got, got_grads = _ring_value_and_grads(rules, q, k, v, sinks_H,
                                           **blocks, **kwargs)
    # Outputs within 1e-5 of their largest magnitude; gradients (sums over
    # the queries, the keys, or all of them for the sinks) within 1e-4.
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    self.assertLen(got_grads, len(want_grads))
    for name, g, w in zip("qkvs", got_grads, want_grads):
      trees.assert_close(g, w, rtol=1e-4, scaled_atol=1e-4,
                         err_msg=f"d{name}")

  @parameterized.named_parameters(*_CASES)
  def test_sequence4_matches_reference(self, **case):
    """Chunks of 8 tokens in tiles of 3 queries x 5 keys (the last ones
    padded)."""
    self._check(_rules(sequence=4), block_q=3, block_kv=5, **case)

  @parameterized.named_parameters(*_CASES[1::4])
  def test_data2_sequence4_matches_reference(self, **case):
    """One tile per chunk."""
    self._check(_rules(data=2, sequence=4), **case)

  def test_sequence2_tensor2_data2_matches_reference(self):
    self._check(_rules(data=2, sequence=2, tensor=2), num_heads=4,
                num_kv_heads=2, window=9, segments=True, sinks=True)

  def test_sequence8_value_dim_differs(self):
    self._check(_rules(sequence=8), num_heads=2, num_kv_heads=2,
                value_dim=12, block_q=2, block_kv=2)

  def test_bf16_matches_reference(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K, dtype=jnp.bfloat16)
    kwargs = dict(scale=0.4, window=11,
                  segment_ids_BL=kernel_testing.segments(_B, _L))
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, None, **kwargs)
    got, got_grads = _ring_value_and_grads(_rules(sequence=4), q, k, v, None,
                                           block_q=3, block_kv=5, **kwargs)
    self.assertEqual(got.dtype, jnp.bfloat16)
    # bf16 rounds at 2**-8 relative; outputs and grads are O(1), outputs up
    # to ~3 (where a unit in the last place is 1.6e-2).
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=1e-2,
                               atol=2e-2)
    for name, g, w in zip("qkv", got_grads, want_grads):
      self.assertEqual(g.dtype, jnp.bfloat16)
      np.testing.assert_allclose(np.float32(g), np.float32(w), atol=5e-2,
                                 err_msg=f"d{name}")

  def test_compiled_step_rotates_keys_instead_of_gathering(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    rules = _rules(data=2, sequence=4)
    sharding = rules.compute_sharding(
        (axes.BATCH, axes.LENGTH, None, None), q.shape)

    def loss(q, k, v):
      return ring.ring_attention(q, k, v, scale=0.4).sum()

    with axes.activation_sharding(rules):
      hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2)),
                    in_shardings=(sharding,) * 3).lower(q, k, v).compile(
                    ).as_text()
    self.assertIn("collective-permute", hlo)
    self.assertNotIn("all-gather", hlo)

  def test_needs_a_split_length(self):
    q, k, v = kernel_testing.inputs(_B, _L, 2, 2, _K)
    with self.assertRaisesRegex(ValueError, "split the length 32"):
      ring.ring_attention(q, k, v, scale=1.0)
    with axes.activation_sharding(_rules(sequence=4)):
      with self.assertRaisesRegex(ValueError, "block_q=0 must be"):
        ring.ring_attention(q, k, v, scale=1.0, block_q=0)
    with axes.activation_sharding(_rules(data=2)):
      self.assertEqual(ring.context_axes(_L), ())
      with self.assertRaisesRegex(ValueError, "split the length 32"):
        ring.ring_attention(q, k, v, scale=1.0)

  def test_dispatch_takes_the_ring_only_for_a_split_length(self):
    """`dispatch.attention(context_parallel="ring")` equals the reference
    where the length is split (ring), where it is not, and with an explicit
    mask (decoding over a cache: the implementation as asked)."""
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    want = attention.reference_attention(q, k, v, scale=0.4, window=7)
    mask_BLS = attention.positions_mask(np.tile(np.arange(_L), (_B, 1)), _L,
                                        window=7)

    def attend(q, k, v, mask_BLS=None):
      return dispatch.attention(
          q, k, v, impl="reference", scale=0.4,
          window=None if mask_BLS is not None else 7, mask_BLS=mask_BLS,
          context_parallel="ring")

    def compile_and_run(*args):
      # A fresh function per sharding context: JAX caches traces by
      # function and arguments, and the trace depends on the context.
      compiled = jax.jit(lambda *a: attend(*a)).lower(*args).compile()
      trees.assert_close(compiled(*args), want, rtol=1e-5, scaled_atol=1e-5)
      return "collective-permute" in compiled.as_text()

    self.assertFalse(compile_and_run(q, k, v))
    with axes.activation_sharding(_rules(data=2)):
      self.assertFalse(compile_and_run(q, k, v))
    with axes.activation_sharding(_rules(sequence=4)):
      self.assertTrue(compile_and_run(q, k, v))
      self.assertFalse(compile_and_run(q, k, v, mask_BLS))

  def test_unknown_context_parallel(self):
    q, k, v = kernel_testing.inputs(_B, _L, 2, 2, _K)
    with self.assertRaisesRegex(ValueError, r"'ulysses'; valid: \('allg"):
      dispatch.attention(q, k, v, scale=1.0, context_parallel="ulysses")
    with self.assertRaisesRegex(
        ValueError, "attention_kernel.context_parallel='ulysses' is invalid"):
      dispatch.Kernel(context_parallel="ulysses")
    with self.assertRaisesRegex(
        ValueError, r"context_parallel='ulysses' is invalid; valid values:"
        r" \('allgather', 'ring'\)"):
      dispatch.Kernel(context_parallel="ulysses")
    # Ring attention with MLA layers: models/execution_test.

  def test_heads_split_unlike_kv_heads(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 1, _K)
    with axes.activation_sharding(_rules(sequence=4, tensor=2)):
      with self.assertRaisesRegex(ValueError, "must split alike"):
        ring.ring_attention(q, k, v, scale=1.0)


def _llama_state(context_parallel, **ici):
  """A tiny Llama 3 (GQA, 2 layers) on `ici` with the default rules."""
  values = llama3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=16, mlp_dim=32,
                num_heads=4, num_kv_heads=2, head_dim=8)
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)),
      jax.devices()[:int(np.prod(list(ici.values())))])
  rules = rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))
  return train_state_lib.create_train_state(
      ModelConfig.from_dict(values), execution=execution.Execution(
          attention_kernel=dispatch.Kernel(context_parallel=context_parallel)),
      seed=0, tx=optax.sgd(0.1),
      schedule=optax.constant_schedule(0.1), z_loss=0.0, mesh=mesh,
      rules=rules)


def _llama_batch(state, rows=8, length=16):
  """Tokens with two packed sequences per row (segment ids 1, 2)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, size=(rows, length + 1), dtype=np.int32)
  segment_ids = np.where(np.arange(length) < 6, 1, 2) * np.ones(
      (rows, 1), np.int32)
  positions = np.where(segment_ids == 1, np.arange(length),
                       np.arange(length) - 6).astype(np.int32)
  sharding = state.rules.batch_sharding((rows, length))
  return {key: jax.device_put(value, sharding) for key, value in
          {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "mask": np.ones((rows, length), np.int32),
           "segment_ids": segment_ids, "positions": positions}.items()}


def _loss_and_grads(state, batch):
  return train_step_lib.loss_and_grads(state, batch)[:3:2]


class RingLlamaTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  def test_ring_equals_single_device(self):
    single = _llama_state("ring", data=1)
    want_loss, want_grads = jax.jit(_loss_and_grads)(single,
                                                     _llama_batch(single))
    state = _llama_state("ring", data=2, sequence=4)
    batch = _llama_batch(state)
    step = jax.jit(_loss_and_grads).lower(state, batch).compile()
    loss, grads = step(state, batch)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    # Gradients summed in another order: within 1e-4 of each leaf's
    # largest magnitude.
    trees.assert_trees_close(grads, want_grads, rtol=1e-4, scaled_atol=1e-4)
    # No activation of a data shard (4 rows) is gathered to the full length
    # (16): neither the keys and values [4, 16, 2, 8] nor the inputs of
    # their projections [4, 16, 16]. The all-gather context parallelism
    # gathers them, so the pattern does find such gathers.
    gather_kv = re.compile(r"= f32\[4,16,[^ ]* all-gather")
    hlo = step.as_text()
    self.assertIn("collective-permute", hlo)
    self.assertIsNone(gather_kv.search(hlo))
    allgather = _llama_state("allgather", data=2, sequence=4)
    self.assertIsNotNone(gather_kv.search(
        jax.jit(_loss_and_grads).lower(allgather, batch).compile().as_text()))


if __name__ == "__main__":
  absltest.main()
