"""Tests the Tunix adapter: masks -> segment ids, and logits of padded
Tunix-style inputs equal our decoder's on the unpadded tokens."""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax.numpy as jnp
import numpy as np
from tunix.sft import utils as tunix_utils

from maxtext.models import registry
from maxtext.posttrain import adapter
from testing import tiny_configs
from testing import trees


def _mask_of_segments(segment_ids: np.ndarray) -> np.ndarray:
  """Causal within segments, padding (0) attends to nothing."""
  length = segment_ids.shape[-1]
  causal = np.tril(np.ones((length, length), bool))
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return same & causal & (segment_ids[:, None, :] > 0)


class SegmentIdsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("left_padded", [[0, 0, 1, 1, 1, 1]], [[0, 0, 1, 1, 1, 1]]),
      ("right_padded", [[1, 1, 1, 0, 0, 0]], [[1, 1, 1, 0, 0, 0]]),
      # DPO rows: left-padded prompt, right-padded response; and a hole.
      ("both_sides", [[0, 1, 1, 1, 1, 0]], [[0, 1, 1, 1, 1, 0]]),
      ("hole", [[1, 1, 0, 1, 1, 0]], [[1, 1, 0, 1, 1, 0]]))
  def test_tunix_causal_masks(self, input_mask, want):
    mask = tunix_utils.make_causal_attn_mask(jnp.asarray(input_mask, bool))
    got = np.asarray(adapter.segment_ids_from_attention_mask(mask))
    np.testing.assert_array_equal(got, want)
    # The decoder's mask of those segment ids is Tunix's on every valid
    # query (padding queries are never read).
    valid = np.asarray(input_mask, bool)
    np.testing.assert_array_equal(_mask_of_segments(got)[valid],
                                  np.asarray(mask)[valid])

  def test_packed_block_diagonal_mask(self):
    segments = np.array([[1, 1, 2, 2, 2, 3, 0, 0], [1, 1, 1, 1, 2, 2, 2, 2]])
    got = adapter.segment_ids_from_attention_mask(
        jnp.asarray(_mask_of_segments(segments)))
    np.testing.assert_array_equal(got, segments)


class TunixModelTest(parameterized.TestCase):

  @parameterized.parameters(*tiny_configs.CONFIG_MODULES)
  def test_left_padded_logits_equal_unpadded(self, family):
    cfg = tiny_configs.tiny_model_config(family, window=4)
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    tokens = np.array([[5, 9, 2, 7, 11, 3], [8, 1, 4, 6, 10, 12]], np.int32)
    pad = 3
    padded = np.concatenate([np.zeros((2, pad), np.int32), tokens], axis=1)
    input_mask = jnp.asarray(padded != 0).at[:, pad:].set(True)
    logits, cache = adapter.TunixModel(model)(
        jnp.asarray(padded), tunix_utils.build_positions_from_mask(input_mask),
        None, tunix_utils.make_causal_attn_mask(input_mask))
    self.assertIsNone(cache)
    want = model(jnp.asarray(tokens))
    trees.assert_close(logits[:, pad:], want, rtol=1e-5, atol=1e-5,
                       scaled_atol=1e-5)

  def test_segment_ids_equal_the_decoders(self):
    cfg = tiny_configs.tiny_model_config("llama3", window=4)
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
    segments = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 0], [1] * 8])
    positions = jnp.asarray([[0, 1, 2, 0, 1, 2, 3, 0], list(range(8))])
    got, _ = adapter.TunixModel(model)(tokens, positions,
                                       segment_ids=segments)
    want = model(tokens, positions_BL=positions, segment_ids_BL=segments)
    np.testing.assert_array_equal(got, want)

  def test_refuses_a_cache_and_two_masks(self):
    cfg = tiny_configs.tiny_model_config("llama3", window=4)
    wrapped = adapter.TunixModel(registry.create_model(cfg,
                                                       rngs=nnx.Rngs(0)))
    tokens = jnp.zeros((1, 4), jnp.int32)
    with self.assertRaisesRegex(ValueError, "KV cache.*maxtext.inference"):
      wrapped(tokens, None, object())
    with self.assertRaisesRegex(ValueError, "attention_mask or segment_ids"):
      wrapped(tokens, None, None, jnp.ones((1, 4, 4), bool),
              segment_ids=jnp.ones((1, 4), jnp.int32))


if __name__ == "__main__":
  absltest.main()
