"""Tests of the GPipe schedule against running the stages one after another."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.layers import pipeline


def _stage(params, microbatch):
  """A stage that needs its own rows' side input: tanh(x W + b) * scale."""
  x_bD, scale_b = microbatch
  y_bD = jnp.tanh(x_bD @ params["w"] + params["b"]) * scale_b[:, None]
  return y_bD, scale_b


def _params(stages, dim=4):
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.normal(size=(stages, dim, dim)), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(stages, dim)), jnp.float32)}


def _sequential(params, inputs):
  for stage in range(params["w"].shape[0]):
    inputs = _stage(jax.tree.map(lambda p, s=stage: p[s], params), inputs)
  return inputs[0]


def _piped(params, inputs, microbatches):
  outputs = pipeline.gpipe(
      _stage, params, pipeline.split_microbatches(inputs, microbatches),
      names=(("batch", "embed"), ("batch",)))
  return pipeline.merge_microbatches(outputs)[0]


class PipelineTest(parameterized.TestCase):

  @parameterized.product(stages=(1, 2, 3), microbatches=(1, 2, 6))
  def test_gpipe_equals_the_stages_in_sequence(self, stages, microbatches):
    params = _params(stages)
    rng = np.random.default_rng(1)
    inputs = (jnp.asarray(rng.normal(size=(6, 4)), jnp.float32),
              jnp.arange(1.0, 7.0))
    np.testing.assert_allclose(_piped(params, inputs, microbatches),
                               _sequential(params, inputs), rtol=1e-6)

    def grads(fn):
      return jax.grad(lambda p, x: jnp.sum(fn(p, (x, inputs[1])) ** 2),
                      argnums=(0, 1))(params, inputs[0])

    # Gradients reach ~100: float32 rounding is ~1e-5 absolute.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                         atol=1e-4),
                 grads(lambda p, x: _piped(p, x, microbatches)),
                 grads(_sequential))

  def test_microbatches_interleave_rows(self):
    x_B = np.arange(6)
    split = pipeline.split_microbatches(x_B, 3)
    np.testing.assert_array_equal(split, [[0, 3], [1, 4], [2, 5]])
    np.testing.assert_array_equal(pipeline.merge_microbatches(split), x_B)

  def test_batch_must_split_into_microbatches(self):
    with self.assertRaisesRegex(
        ValueError, "batch of 6 rows does not split into 4 pipeline"
        " microbatches; set model.pipeline_microbatches"):
      pipeline.split_microbatches(np.zeros((6, 2)), 4)


if __name__ == "__main__":
  absltest.main()
