"""Int8 weight-only PTQ of tiny unscanned decoders (tied Gemma 3 and a
Llama 3 with its own output head).

Measured on these random models: the logits move by at most 1.0% (Gemma 3)
and 1.8% (Llama 3) of the largest logit (bound 3%) and the top-1 token
agrees at 100% and 95.3% of the 64 positions (bound 90%); the quantized
kernels are numpy's per-output-channel absmax int8 quantization; their
bytes shrink 3.79x (int8 values plus float32 scales; bound 3.5x; all
parameters 314 KB -> 97 KB for Gemma 3); greedy generation with the KV
cache equals greedy decoding by full forward passes of the quantized model.
"""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import gemma3
from configs import llama3
from maxtext.common.model_config import ModelConfig
from maxtext.inference import generate
from maxtext.models import registry
from maxtext.quant import ptq

_VOCAB = 64
_TOKENS = jnp.asarray(
    np.random.default_rng(0).integers(0, _VOCAB, size=(4, 16)), jnp.int32)
_SHAPES = dict(vocab_size=_VOCAB, num_layers=2, embed_dim=64, mlp_dim=128,
               num_heads=4, num_kv_heads=2, head_dim=16)
_FAMILIES = {
    "gemma3": (gemma3, dict(query_pre_attn_scalar=16.0, sliding_window=4,
                            global_layer_interval=2)),
    "llama3": (llama3, dict(tie_embeddings=False)),
}


def _model(family: str, scan_layers: bool = False) -> nnx.Module:
  module, fields = _FAMILIES[family]
  values = module.get_config().model.to_dict()
  values.update(_SHAPES, scan_layers=scan_layers, **fields)
  return registry.create_model(ModelConfig.from_dict(values), rngs=nnx.Rngs(0))


def _kernels(model: nnx.Module) -> dict[str, object]:
  """Every quantized kernel's {"qvalue", "scale"}, by path."""
  found = {}
  state = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  for path, leaf in jax.tree_util.tree_leaves_with_path(
      state, is_leaf=lambda x: isinstance(x, dict) and "qvalue" in x):
    if isinstance(leaf, dict):
      found[path] = leaf
  return found


class PtqTest(parameterized.TestCase):

  @parameterized.parameters("gemma3", "llama3")
  def test_int8_kernels_and_logits_near_full_precision(self, family):
    model = _model(family)
    quantized = ptq.quantize_for_decode(model, ptq.PtqConfig())
    want = model(_TOKENS)
    got = quantized(_TOKENS)
    error = float(jnp.abs(got - want).max() / jnp.abs(want).max())
    self.assertLess(error, 0.03)
    self.assertGreater(error, 1e-4)  # Quantized: the logits moved.
    agreement = float(jnp.mean(got.argmax(-1) == want.argmax(-1)))
    self.assertGreaterEqual(agreement, 0.9)

    floats = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    kernels = _kernels(quantized)
    # Every attention and MLP projection (7 per layer), and the head.
    self.assertLen(kernels, 7 * 2 + (family == "llama3"))
    float_bytes = quantized_bytes = 0
    for path, leaf in kernels.items():
      # The path ends with ("kernel", "array"); the float kernel is at
      # ("kernel",).
      kernel = np.asarray(_at(floats, path[:-1]))
      qvalue, scale = np.asarray(leaf["qvalue"]), np.asarray(leaf["scale"])
      self.assertEqual(qvalue.dtype, np.int8)
      # numpy reference: one scale per output channel, the absmax over the
      # contracted (input) axes mapped to qwix's symmetric int8 range 127.5;
      # each value rounded to the nearest step.
      num_in = kernel.ndim - sum(size > 1 for size in scale.shape)
      want_scale = np.abs(kernel).max(axis=tuple(range(num_in)),
                                      keepdims=True) / 127.5
      np.testing.assert_allclose(scale, want_scale, rtol=1e-6)
      np.testing.assert_array_less(
          np.abs(qvalue * scale - kernel),
          np.broadcast_to(0.5001 * scale, kernel.shape))
      float_bytes += kernel.nbytes
      quantized_bytes += qvalue.nbytes + scale.nbytes
    self.assertGreater(float_bytes / quantized_bytes, 3.5)
    self.assertEqual(
        ptq.param_bytes(model) - ptq.param_bytes(quantized),
        float_bytes - quantized_bytes)

  def test_greedy_generation_equals_full_forward_decoding(self):
    quantized = ptq.quantize_for_decode(_model("llama3"), ptq.PtqConfig())
    prompt = [int(t) for t in _TOKENS[0, :5]]
    got = generate.generate(quantized, [prompt], max_new_tokens=6)[0]
    want = list(prompt)
    for _ in range(6):
      want.append(int(quantized(jnp.asarray([want]))[0, -1].argmax()))
    self.assertEqual(got, want[len(prompt):])

  def test_bad_input_is_named(self):
    with self.assertRaisesRegex(ValueError, r"quantize='int4' is invalid;"
                                r" valid: \['int8'\]"):
      ptq.PtqConfig(qtype="int4")
    with self.assertRaisesRegex(ValueError, "needs an unscanned model"
                                r".*scan_layers=True, remat.policy='none'"):
      ptq.quantize_for_decode(_model("llama3", scan_layers=True),
                              ptq.PtqConfig())
    with self.assertRaisesRegex(ValueError, "module_path='nothing' matches"
                                " no matmul"):
      ptq.quantize_for_decode(_model("llama3"),
                              ptq.PtqConfig(module_path="nothing"))


def _at(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


if __name__ == "__main__":
  absltest.main()
