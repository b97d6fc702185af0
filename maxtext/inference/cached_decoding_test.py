"""KV-cache decoding equals full recomputation, for every family.

Our own small models of each family (config files shrunk, windows of 3):
prefill a prompt, then feed one token per step through the cache; the
logits at every position must equal a full forward pass (max |diff| 1e-4),
also past the sliding window, scanned and unscanned; likewise with a paged
cache whose pages lie shuffled in the pool (windows, sinks).
"""


from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
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
def _prefill(model, tokens_BP, cache):
  positions_BP = jnp.broadcast_to(jnp.arange(tokens_BP.shape[1]),
                                  tokens_BP.shape)
  return model(tokens_BP, positions_BP, cache=cache)


@nnx.jit
def _step(model, token_B1, position_B1, cache):
  return model(token_B1, position_B1, cache=cache)


class CachedDecodingTest(parameterized.TestCase):

  def max_diff(self, model, cache):
    """max |logits from the cache - full forward| over 2 rows."""
    tokens_BL = jnp.asarray(
        np.random.RandomState(0).randint(0, 64, size=(2, _LENGTH)))
    want_BLV = np.asarray(_full_logits(model, tokens_BL))
    logits_BPV, cache = _prefill(model, tokens_BL[:, :_PROMPT], cache)
    got = [np.asarray(logits_BPV)]
    for position in range(_PROMPT, _LENGTH):
      logits_B1V, cache = _step(model, tokens_BL[:, position:position + 1],
                                jnp.full((2, 1), position), cache)
      got.append(np.asarray(logits_B1V))
    return float(np.abs(np.concatenate(got, axis=1) - want_BLV).max())

  @parameterized.product(family=sorted(tiny_configs.CONFIG_MODULES),
                         scan_layers=(True, False))
  def test_cached_logits_equal_full_forward(self, family, scan_layers):
    cfg = _tiny(family, scan_layers=scan_layers)
    model = _model(cfg)
    diff = self.max_diff(model, model.init_cache(2, _LENGTH))
    print(f"{family} scan_layers={scan_layers} window={cfg.sliding_window}: "
          f"max |cached - full| = {diff:.3g}")
    self.assertLessEqual(diff, _TOLERANCE)

  @parameterized.parameters(("gemma3", True), ("gpt_oss", False))
  def test_paged_logits_equal_full_forward(self, family, scan_layers):
    model = _model(_tiny(family, scan_layers=scan_layers))
    page_size, pages_per_row, num_pages = 4, _LENGTH // 4, 9
    page_table_BN = np.random.RandomState(1).permutation(num_pages)[
        :2 * pages_per_row].reshape(2, pages_per_row)
    cache = kv_cache.paged_like(
        model.init_cache(2, 1), num_pages=num_pages, page_size=page_size,
        page_table_BN=jnp.asarray(page_table_BN), impl="jax")
    diff = self.max_diff(model, cache)
    print(f"{family} scan_layers={scan_layers} paged: max |cached - full| ="
          f" {diff:.3g}")
    self.assertLessEqual(diff, _TOLERANCE)

  def test_cache_layouts(self):
    for scan_layers, kind in ((True, "stacked"), (False, "tuple")):
      cache = _model(_tiny("qwen3", scan_layers=scan_layers)).init_cache(2, 7)
      if kind == "stacked":
        self.assertEqual(cache.key_BSGK.shape, (3, 2, 7, 2, 8))
      else:
        self.assertLen(cache, 3)
        self.assertEqual(cache[0].value_BSGK.shape, (2, 7, 2, 8))

if __name__ == "__main__":
  absltest.main()
