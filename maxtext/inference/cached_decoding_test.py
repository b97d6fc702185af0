"""KV-cache decoding equals full recomputation, for every family.

Our own small models of each family (config files shrunk, windows of 3):
prefill a prompt, then feed one token per step through the cache; the
logits at every position must equal a full forward pass (max |diff| 1e-4),
also past the sliding window, scanned and unscanned; likewise with a paged
cache whose pages lie shuffled in the pool (windows, sinks), read through
one page table passed to each call, which no layer's cache holds.
"""


from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.layers import kv_cache
from maxtext.models import registry
from testing import tiny_configs


_WINDOW = 3
_PROMPT = 4
_LENGTH = 12  # Prompt + generated tokens, longer than the window.
_TOLERANCE = 1e-4


def _tiny(family: str, **changes) -> ModelConfig:
  return tiny_configs.tiny_model_config(family, window=_WINDOW, **changes)


def _model(cfg: ModelConfig) -> nnx.Module:
  return registry.create_model(cfg, rngs=nnx.Rngs(1))


@nnx.jit
def _full_logits(model, tokens_BL):
  return model(tokens_BL)


@nnx.jit
def _prefill(model, tokens_BP, cache, page_table_BN):
  positions_BP = jnp.broadcast_to(jnp.arange(tokens_BP.shape[1]),
                                  tokens_BP.shape)
  return model(tokens_BP, positions_BP, cache=cache,
               page_table_BN=page_table_BN)


@nnx.jit
def _step(model, token_B1, position_B1, cache, page_table_BN):
  return model(token_B1, position_B1, cache=cache,
               page_table_BN=page_table_BN)


class CachedDecodingTest(parameterized.TestCase):

  def max_diff(self, model, cache, page_table_BN=None):
    """(max |logits from the cache - full forward| over 2 rows, the cache
    after the last step)."""
    tokens_BL = jnp.asarray(
        np.random.RandomState(0).randint(0, 64, size=(2, _LENGTH)))
    want_BLV = np.asarray(_full_logits(model, tokens_BL))
    logits_BPV, cache = _prefill(model, tokens_BL[:, :_PROMPT], cache,
                                 page_table_BN)
    got = [np.asarray(logits_BPV)]
    for position in range(_PROMPT, _LENGTH):
      logits_B1V, cache = _step(model, tokens_BL[:, position:position + 1],
                                jnp.full((2, 1), position), cache,
                                page_table_BN)
      got.append(np.asarray(logits_B1V))
    diff = float(np.abs(np.concatenate(got, axis=1) - want_BLV).max())
    return diff, cache

  @parameterized.product(family=sorted(tiny_configs.CONFIG_MODULES),
                         scan_layers=(True, False))
  def test_cached_logits_equal_full_forward(self, family, scan_layers):
    cfg = _tiny(family, scan_layers=scan_layers)
    model = _model(cfg)
    diff, _ = self.max_diff(model, model.init_cache(2, _LENGTH))
    print(f"{family} scan_layers={scan_layers}"
          f" window={cfg.pattern.sliding_window}: "
          f"max |cached - full| = {diff:.3g}")
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(("gemma3", True), ("gpt_oss", False),
                            ("deepseek3_2", False))
  def test_paged_logits_equal_full_forward(self, family, scan_layers):
    model = _model(_tiny(family, scan_layers=scan_layers))
    page_size, pages_per_row, num_pages = 4, _LENGTH // 4, 9
    page_table_BN = np.random.RandomState(1).permutation(num_pages)[
        :2 * pages_per_row].reshape(2, pages_per_row)
    cache = kv_cache.paged_like(
        model.init_cache(2, 1), num_pages=num_pages, page_size=page_size,
        impl="jax")
    diff, cache = self.max_diff(model, cache, jnp.asarray(page_table_BN))
    print(f"{family} scan_layers={scan_layers} paged: max |cached - full| ="
          f" {diff:.3g}")
    self.assertLessEqual(diff, _TOLERANCE)
    # The page table is the caller's, passed to each call: the layers'
    # caches hold only their pages [(layers,) P, T, G, K].
    leading = (3,) if scan_layers else ()
    self.assertEqual(
        {leaf.shape[:len(leading) + 2] for leaf in jax.tree.leaves(cache)},
        {(*leading, num_pages, page_size)})

  def test_cache_layouts(self):
    for scan_layers, kind in ((True, "stacked"), (False, "tuple")):
      cache = _model(_tiny("qwen3", scan_layers=scan_layers)).init_cache(2, 7)
      self.assertEqual(list(cache), ["blocks"])  # One cache per layer kind.
      cache = cache["blocks"]
      if kind == "stacked":
        self.assertEqual(cache.key_BSGK.shape, (3, 2, 7, 2, 8))
      else:
        self.assertLen(cache, 3)
        self.assertEqual(cache[0].value_BSGK.shape, (2, 7, 2, 8))

if __name__ == "__main__":
  absltest.main()
