"""Generation with a paged KV cache equals generation with the dense one.

Our own small models (windows of 3): Llama 3 (GQA), Gemma 2 (sliding
windows, attention logit soft-cap), GPT-OSS (sinks, windows), Llama 4
(chunks of 3, NoPE), Gemma 4 (wider global heads, values equal to keys),
DeepSeek-V3 (latent attention: pages of latents) and DeepSeek-V3.2 (sparse
attention over the pages, past its top 4), rows of
different prompt lengths over several pages: the same greedy tokens, log-
probs within 1e-5. The paged attention implementations ("jax", "reference")
give the same generation; a pool smaller than every row's full length serves
a batch whose rows need fewer pages, one page fewer runs out and says so,
a row that stops gives its pages to the others; bad settings are refused by
name.
"""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import numpy as np

from maxtext.inference import generate
from maxtext.models import registry
from testing import tiny_configs

_PROMPTS = [[5, 1, 8, 60, 33, 2, 14, 40, 7], [3, 9, 27], [4]]
_NEW_TOKENS = 8


def _model(family: str) -> nnx.Module:
  cfg = tiny_configs.tiny_model_config(family, window=3)
  return registry.create_model(cfg, rngs=nnx.Rngs(1))


class PagedGenerateTest(parameterized.TestCase):

  def assert_same_generation(self, got, want):
    (got_tokens, got_logprobs), (want_tokens, want_logprobs) = got, want
    self.assertEqual(got_tokens, want_tokens)
    for got_row, want_row in zip(got_logprobs, want_logprobs):
      np.testing.assert_allclose(got_row, want_row, atol=1e-5, rtol=0)

  @parameterized.parameters("llama3", "gemma2", "gpt_oss", "llama4",
                            "gemma4", "deepseek3", "deepseek3_2")
  def test_paged_equals_dense(self, family):
    model = _model(family)
    dense = generate.generate_with_logprobs(model, _PROMPTS,
                                            max_new_tokens=_NEW_TOKENS)
    paged = generate.generate_with_logprobs(
        model, _PROMPTS, max_new_tokens=_NEW_TOKENS, kv_cache="paged",
        page_size=4, paged_attention_impl="jax")
    self.assert_same_generation(paged, dense)

  def test_reference_impl_equals_jax_impl(self):
    model = _model("gpt_oss")

    def paged(impl):
      return generate.generate_with_logprobs(
          model, _PROMPTS, max_new_tokens=_NEW_TOKENS, kv_cache="paged",
          page_size=2, paged_attention_impl=impl)

    self.assert_same_generation(paged("reference"), paged("jax"))

  def test_small_pool_serves_rows_that_need_fewer_pages(self):
    model = _model("llama3")
    prompts = [_PROMPTS[0][:8], _PROMPTS[1][:2]]
    # Row b writes positions 0 .. len_b + 6 (the last token is not fed
    # back): ceil(15 / 4) + ceil(9 / 4) = 7 pages of 4, where every row
    # reaching the padded length 8 + 8 would take 2 * 4 = 8.
    dense = generate.generate_with_logprobs(model, prompts,
                                            max_new_tokens=_NEW_TOKENS)
    paged = generate.generate_with_logprobs(
        model, prompts, max_new_tokens=_NEW_TOKENS, kv_cache="paged",
        page_size=4, num_pages=7)
    self.assert_same_generation(paged, dense)
    with self.assertRaisesRegex(ValueError,
                                "ran out of pages.*num_pages=6.*page_size=4"):
      generate.generate(model, prompts, max_new_tokens=_NEW_TOKENS,
                        kv_cache="paged", page_size=4, num_pages=6)

  def test_a_stopped_row_gives_its_pages_to_the_others(self):
    model = _model("llama3")
    prompts, stop_ids = [[9, 8], [4, 7]], (10,)
    dense = generate.generate_with_logprobs(
        model, prompts, max_new_tokens=_NEW_TOKENS, stop_ids=stop_ids)
    # Row 0 stops at its second token, having written positions 0..2 (2
    # pages of 2); row 1 runs on to position 8 (5 pages): 5 pages serve
    # both only if row 1 reuses row 0's.
    self.assertEqual([len(tokens) for tokens in dense[0]], [2, _NEW_TOKENS])
    paged = generate.generate_with_logprobs(
        model, prompts, max_new_tokens=_NEW_TOKENS, stop_ids=stop_ids,
        kv_cache="paged", page_size=2, num_pages=5)
    self.assert_same_generation(paged, dense)

  def test_bad_settings_are_named(self):
    model = _model("llama3")
    for kwargs, message in (
        (dict(kv_cache="ragged"), r"kv_cache='ragged' is invalid; valid: "
         r"\['dense', 'paged'\]"),
        (dict(kv_cache="paged", page_size=0), "page_size=0"),
        (dict(kv_cache="paged", num_pages=0), "num_pages=0"),
        (dict(kv_cache="paged", paged_attention_impl="cuda"),
         "paged_attention_impl='cuda' is invalid")):
      with self.assertRaisesRegex(ValueError, message):
        generate.generate(model, [[1]], max_new_tokens=2, **kwargs)


if __name__ == "__main__":
  absltest.main()
