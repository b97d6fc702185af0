"""Tests of the GPipe and circular schedules against running the chunks of
layers one after another."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.layers import pipeline
from testing import trees


def _stage(params, microbatch):
  """A chunk that needs its own rows' side input: tanh(x W + b) * scale."""
  x_bD, scale_b = microbatch
  y_bD = jnp.tanh(x_bD @ params["w"] + params["b"]) * scale_b[:, None]
  return y_bD, scale_b


def _params(stages, repeats, dim=4):
  """Chunk parameters [S, R, ...]; chunk r S + s is [s, r]."""
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.normal(size=(stages, repeats, dim, dim)),
                           jnp.float32),
          "b": jnp.asarray(rng.normal(size=(stages, repeats, dim)),
                           jnp.float32)}


def _sequential(params, inputs):
  stages, repeats = params["w"].shape[:2]
  for chunk in range(stages * repeats):
    inputs = _stage(jax.tree.map(lambda p, c=chunk: p[c % stages,
                                                      c // stages], params),
                    inputs)
  return inputs[0]


def _piped(params, inputs, microbatches):
  outputs = pipeline.circular(
      _stage, params, pipeline.split_microbatches(inputs, microbatches),
      names=(("batch", "embed"), ("batch",)))
  return pipeline.merge_microbatches(outputs)[0]


def _inputs():
  rng = np.random.default_rng(1)
  return (jnp.asarray(rng.normal(size=(6, 4)), jnp.float32),
          jnp.arange(1.0, 7.0))


class PipelineTest(parameterized.TestCase):

  @parameterized.parameters(
      # GPipe, including fewer microbatches than stages.
      (1, 1, 1), (1, 1, 6), (2, 1, 1), (2, 1, 2), (3, 1, 2), (3, 1, 6),
      # Circular: microbatches == stages (no wait between passes) and more
      # (finished passes wait in the microbatch buffer), a multiple of the
      # stages or not.
      (2, 2, 2), (2, 2, 3), (2, 3, 6), (3, 2, 3), (3, 2, 6), (1, 3, 2))
  def test_schedule_equals_the_chunks_in_sequence(self, stages, repeats,
                                                  microbatches):
    params = _params(stages, repeats)
    inputs = _inputs()
    # The two programs fuse and round differently (at the tests' LLVM -O0
    # up to 2.5e-5 relative on outputs of size ~1): within 1e-4 relative
    # and 1e-4 of the largest magnitude; a wrong schedule is off by O(1).
    trees.assert_close(_piped(params, inputs, microbatches),
                       _sequential(params, inputs), rtol=1e-4,
                       scaled_atol=1e-4)

    def grads(fn):
      return jax.grad(lambda p, x: jnp.sum(fn(p, (x, inputs[1])) ** 2),
                      argnums=(0, 1))(params, inputs[0])

    # Gradients reach ~100 through up to 6 tanh layers, and the two
    # programs fuse and round differently (at the tests' LLVM -O0 up to
    # 2.6e-4 relative, 1.4e-3 absolute): within 1e-3 relative and 1e-4 of
    # each leaf's largest magnitude; a wrong schedule is off by O(1).
    trees.assert_trees_close(grads(lambda p, x: _piped(p, x, microbatches)),
                             grads(_sequential), rtol=1e-3, scaled_atol=1e-4)

  def test_circular_needs_a_microbatch_per_stage(self):
    with self.assertRaisesRegex(
        ValueError, "needs at least as many microbatches as stages: 2"
        " microbatches < 3 stages \\(with 2 repeats\\); set"
        " pipeline.microbatches to 3 or more"):
      _piped(_params(3, 2), _inputs(), 2)

  def test_microbatches_interleave_rows(self):
    x_B = np.arange(6)
    split = pipeline.split_microbatches(x_B, 3)
    np.testing.assert_array_equal(split, [[0, 3], [1, 4], [2, 5]])
    np.testing.assert_array_equal(pipeline.merge_microbatches(split), x_B)

  def test_batch_must_split_into_microbatches(self):
    with self.assertRaisesRegex(
        ValueError, "batch of 6 rows does not split into 4 pipeline"
        " microbatches; set pipeline.microbatches"):
      pipeline.split_microbatches(np.zeros((6, 2)), 4)


if __name__ == "__main__":
  absltest.main()
