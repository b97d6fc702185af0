"""Greedy generation equals transformers' `generate(do_sample=False)`.

For each family of `testing/hf_tiny_models.py` (Llama 2 checkpoints load
as llama3): a tiny random Hugging Face model, its weights loaded into our
model with stacked layers (the training layout; `generate` decodes with them
unstacked, so an unscanned model runs the same decode program, and
`generate_test` checks both layouts give the same tokens), two prompts of
different lengths generated in one batch; each row must equal transformers'
greedy generation of that prompt alone. The sliding-window families
(window 5) generate past their window.
"""


from absl.testing import absltest
from absl.testing import parameterized

from maxtext.inference import generate
from maxtext.models import registry
from maxtext.models import hf_weights
from testing import hf_reference
from testing import hf_tiny_models

_PROMPTS = [[5, 17, 99, 3, 42, 8, 64, 2], [11, 7, 120]]
_NEW_TOKENS = 16


class HfGreedyTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(hf_tiny_models.FAMILIES))
  def test_greedy_matches_transformers(self, family):
    hf_model = hf_tiny_models.tiny_hf_model(family)
    want = [hf_tiny_models.hf_greedy(hf_model, prompt, _NEW_TOKENS)
            for prompt in _PROMPTS]
    cfg = registry.family_module(family).model_config_from_hf(
        hf_model.config.to_dict())
    model = hf_weights.model_from_hf_weights(
        cfg.replace(scan_layers=True), hf_reference.state_dict(hf_model))
    got = generate.generate(model, _PROMPTS, max_new_tokens=_NEW_TOKENS)
    self.assertEqual(got, want)


if __name__ == "__main__":
  absltest.main()
