"""Tests of the vocabulary-parallel head on 8 fake CPU devices
(JAX_NUM_CPU_DEVICES=8, set by the Bazel target): logits and gradients equal
the plain projection on the unsharded arrays, the compiled gradient neither
gathers nor all-reduces the whole kernel, the plain projection is kept where
splitting the vocabulary gains nothing, and a tiny Llama (untied head) and
Gemma 3 (tied embedding) under FSDP give the single-device loss and gradients,
and a head quantized by qwix keeps its quantization there (qwix intercepts the
head's own matmul)."""

import functools
import re

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import common
from maxtext.common import axes
from maxtext.layers import vocab_parallel
from maxtext.models import registry
from maxtext.quant import ptq
from maxtext.quant import qat
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import devices
from testing import tiny_configs
from testing import trees

_B, _L, _D, _V = 8, 4, 16, 64
_HEAD = (axes.EMBED, axes.VOCAB)
_TABLE = (axes.VOCAB, axes.EMBED)


def _rules(**ici):
  """The default rule tables on a mesh of `ici` axis sizes."""
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)),
      jax.devices()[:int(np.prod(list(ici.values())))])
  return rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))


def _arrays(names, vocab=_V):
  rng = np.random.default_rng(0)
  kernel_shape = (_D, vocab) if names == _HEAD else (vocab, _D)
  return (jnp.asarray(rng.normal(size=(_B, _L, _D)), jnp.float32),
          jnp.asarray(rng.normal(size=kernel_shape), jnp.float32),
          jnp.asarray(rng.normal(size=(_B, _L, vocab)), jnp.float32))


def _plain(x, kernel, names):
  equation = "bld,dv->blv" if names == _HEAD else "bld,vd->blv"
  return jnp.einsum(equation, x, kernel)


def _placed(rules, x, kernel, names):
  """x split as the batch, the kernel as the parameter rules place it."""
  return (jax.device_put(x, rules.compute_sharding(
      (axes.BATCH, axes.LENGTH, axes.EMBED), x.shape)),
          jax.device_put(kernel, rules.param_sharding(names, kernel.shape)))


def _value_and_grads(rules, names, x, kernel, cotangent):
  """Logits and the gradients of <logits, cotangent> under `rules`."""

  def objective(x, kernel):
    with axes.activation_sharding(rules):
      logits = vocab_parallel.logits(x, kernel, names)
    return (logits * cotangent).sum(), logits

  return jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))


class VocabParallelTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  @parameterized.product(
      ici=(dict(fsdp=8), dict(data=2, fsdp=4), dict(fsdp=4, tensor=2)),
      names=(_HEAD, _TABLE))
  def test_logits_and_gradients_equal_the_plain_projection(self, ici, names):
    x, kernel, cotangent = _arrays(names)
    rules = _rules(**ici)
    placed = _placed(rules, x, kernel, names)
    (_, logits), grads = _value_and_grads(rules, names, *placed,
                                          cotangent)(*placed)
    want_logits, want_vjp = jax.vjp(
        lambda x, k: _plain(x, k, names), x, kernel)
    # Sums of 16 to 64 products: within 1e-5 of the largest magnitude.
    trees.assert_close(logits, want_logits, rtol=1e-5, scaled_atol=1e-5)
    for got, want in zip(grads, want_vjp(cotangent)):
      trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    # Split over the vocabulary along fsdp (after tensor), rows only over
    # what splits the batch besides fsdp; the kernel gradient keeps the
    # kernel's stored layout.
    self.assertEqual(axes.spec_axes(logits.sharding.spec, 3), (
        ("data",) if "data" in ici else (), (),
        ("tensor", "fsdp") if "tensor" in ici else ("fsdp",)))
    self.assertEqual(axes.spec_axes(grads[1].sharding.spec, 2),
                     axes.spec_axes(rules.param_spec(names, kernel.shape), 2))

  def test_no_whole_kernel_is_gathered_or_all_reduced(self):
    x, kernel, cotangent = _arrays(_HEAD)
    rules = _rules(fsdp=8)
    placed = _placed(rules, x, kernel, _HEAD)
    hlo = _value_and_grads(rules, _HEAD, *placed, cotangent).lower(
        *placed).compile().as_text()
    # Result shapes of the collectives (a tuple for a multi-operand one).
    collectives = re.findall(r"= (.*) (all-gather|all-reduce|all-to-all)\(",
                             hlo)
    self.assertIn("all-to-all", {kind for _, kind in collectives})
    whole = f"f32[{_D},{_V}]"
    self.assertEqual([shape for shape, kind in collectives
                      if kind != "all-to-all" and whole in shape], [], hlo)

  @parameterized.named_parameters(
      ("data_parallel", dict(data=8), _V),
      ("length_split", dict(fsdp=4, sequence=2), _V),
      ("vocab_not_divisible", dict(fsdp=8), 60),
  )
  def test_plain_where_splitting_gains_nothing(self, ici, vocab):
    x, kernel, _ = _arrays(_HEAD, vocab)
    self.assertIsNone(vocab_parallel.logits(x, kernel, _HEAD))  # No rules.
    with axes.activation_sharding(_rules(**ici)):
      self.assertIsNone(vocab_parallel.logits(x, kernel, _HEAD))


def _config(family: str):
  """A small `family` model: llama3 with an untied output head, gemma3 with
  its tied embedding table."""
  changes = dict(vocab_size=_V, num_layers=2, embed_dim=_D, mlp_dim=32)
  if family == "llama3":
    return tiny_configs.tiny_model_config(family, window=4,
                                          tie_embeddings=False, **changes)
  return tiny_configs.tiny_model_config(
      family, window=4, num_heads=2, num_kv_heads=1, head_dim=8,
      query_pre_attn_scalar=8.0, global_layer_interval=2, **changes)


def _loss_and_grads(family, **ici):
  rules = _rules(**ici)
  state = train_state_lib.create_train_state(
      _config(family), seed=0, tx=optax.sgd(0.1),
      schedule=optax.constant_schedule(0.1), z_loss=1e-2, mesh=rules.mesh,
      rules=rules)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, _V, size=(_B, 17), dtype=np.int32)
  mask = np.ones((_B, 16), np.int32)
  mask[3, 10:] = 0
  sharding = rules.batch_sharding((_B, 16))
  batch = {key: jax.device_put(value, sharding) for key, value in
           {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
            "mask": mask}.items()}
  step = jax.jit(train_step_lib.loss_and_grads)
  hlo = step.lower(state, batch).compile().as_text()
  loss, z_term, grads, _ = step(state, batch)
  return float(loss), float(z_term), grads, hlo


class VocabParallelModelTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  @parameterized.parameters("llama3", "gemma3")
  def test_fsdp_loss_and_gradients_equal_one_device(self, family):
    want_loss, want_z, want_grads, _ = _loss_and_grads(family, data=1)
    loss, z_term, grads, hlo = _loss_and_grads(family, fsdp=8)
    self.assertIn("all-to-all", hlo)  # The head ran vocabulary-parallel.
    # Log-sum-exps over the vocabulary, and gradients, summed in another
    # order: losses within 1e-5 relative, gradients within 1e-4 of each
    # leaf's largest magnitude.
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(z_term, want_z, rtol=1e-5)
    trees.assert_trees_close(grads, want_grads, rtol=1e-4, scaled_atol=1e-4)

  @parameterized.parameters("ptq", "qat")
  def test_a_head_quantized_by_qwix_keeps_its_quantization(self, method):
    # PTQ stores the kernel as a qwix array; QAT keeps a plain array and
    # fake-quantizes inside the head's intercepted matmul.
    config = _config("llama3").replace(scan_layers=False)
    model = registry.create_model(config, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(
        0, _V, size=(_B, 16)), jnp.int32)
    if method == "ptq":
      quantized = ptq.quantize_for_decode(model,
                                          ptq.PtqConfig(module_path="head"))
    else:
      quantized = qat.quantize_for_training(
          model, qat.QatConfig(qtype="int8", module_path="head"), tokens)
    # Both runs start from the same state (QAT updates its statistics).
    graphdef, state = nnx.split(quantized)
    rules = _rules(fsdp=8)

    @functools.partial(jax.jit, static_argnums=0)
    def logits(rules, state, tokens):
      with axes.activation_sharding(rules):
        return nnx.merge(graphdef, state)(tokens)

    want = logits(None, state, tokens)
    self.assertGreater(float(jnp.abs(want - model(tokens)).max()), 1e-4)
    tokens = jax.device_put(tokens, rules.batch_sharding(tokens.shape))
    # The head keeps its own (intercepted) projection: no kernel exchange.
    hlo = logits.lower(rules, state, tokens).compile().as_text()
    self.assertFalse("all-to-all" in hlo, "the head ran vocabulary-parallel")
    if method == "ptq":  # QAT's fake quantization is not shard-invariant.
      trees.assert_close(logits(rules, state, tokens), want, rtol=1e-5,
                         atol=1e-5, scaled_atol=1e-5)


if __name__ == "__main__":
  absltest.main()
