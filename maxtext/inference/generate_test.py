"""Tests of the jitted generation loop on our own small models.

Padding a prompt in a batch must not change its generation (sliding-window
families included), greedy continues the full forward's argmax, top-k=1 is
greedy, sampling is reproducible by seed, EOS (or any of several stop
tokens) stops one row, suppressed tokens never appear, the returned
log-probs are the full forward's log-softmax (stacked dense and expert
layers included), stacked and unstacked layers with the same weights
generate the same tokens, a pipelined model decodes like the same weights
unpipelined, and prompts padded to one bucket share one compilation.
"""


from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax.numpy as jnp
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.inference import generate
from maxtext.inference import sampler
from maxtext.layers import pipeline
from maxtext.models import execution
from maxtext.models import hf_weights
from maxtext.models import registry
from testing import tiny_configs


_WINDOW = 3


def _tiny(family: str, **changes) -> ModelConfig:
  return tiny_configs.tiny_model_config(family, window=_WINDOW, **changes)


def _model(cfg: ModelConfig,
           execution_config: execution.Execution = execution.Execution()
           ) -> nnx.Module:
  return registry.create_model(cfg, rngs=nnx.Rngs(1),
                               execution=execution_config)


@nnx.jit
def _full_logits(model, tokens_BL):
  return model(tokens_BL)


class GenerateTest(parameterized.TestCase):

  @parameterized.parameters(("gemma3", True), ("gemma3", False),
                            ("mistral", True))
  def test_padding_does_not_change_a_row(self, family, scan_layers):
    model = _model(_tiny(family, scan_layers=scan_layers))
    short, long = [3, 9, 27], [5, 1, 8, 60, 33, 2, 14, 40, 7]
    alone = generate.generate(model, [short], max_new_tokens=10)[0]
    batched = generate.generate(model, [long, short, long[:5]],
                                max_new_tokens=10)
    self.assertEqual(batched[1], alone)
    self.assertEqual(batched[0],
                     generate.generate(model, [long], max_new_tokens=10)[0])

  def test_greedy_continues_the_argmax_of_the_full_forward(self):
    model = _model(_tiny("gemma2"))
    prompt = [4, 8, 15, 16, 23]
    out = generate.generate(model, [prompt], max_new_tokens=8)[0]
    logits = np.asarray(_full_logits(model, jnp.asarray([prompt + out])))[0]
    self.assertEqual(np.argmax(logits[len(prompt) - 1:-1], -1).tolist(), out)

  def test_pipelined_model_decodes_like_the_same_weights_unpipelined(self):
    # Decoding unstacks the layers; the pipeline stages play no part.
    cfg = _tiny("llama3").replace(num_layers=4)
    prompts = [[1, 2, 3], [9, 8]]
    pipelined = _model(cfg, execution.Execution(
        pipeline=pipeline.PipelineConfig(stages=2)))
    self.assertEqual(
        generate.generate(pipelined, prompts, max_new_tokens=6),
        generate.generate(_model(cfg), prompts, max_new_tokens=6))

  def test_top_k_1_equals_greedy(self):
    model = _model(_tiny("gemma3"))
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5]]
    greedy = generate.generate(model, prompts, max_new_tokens=8)
    top1 = generate.generate(
        model, prompts, max_new_tokens=8, seed=3,
        params=sampler.SamplingParams(temperature=2.0, top_k=1))
    self.assertEqual(top1, greedy)

  def test_sampling_is_reproducible_by_seed(self):
    model = _model(_tiny("llama3"))
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5]]
    params = sampler.SamplingParams(temperature=1.5, top_p=0.9)
    first = generate.generate(model, prompts, max_new_tokens=12, seed=7,
                              params=params)
    self.assertEqual(generate.generate(model, prompts, max_new_tokens=12,
                                       seed=7, params=params), first)
    self.assertNotEqual(generate.generate(model, prompts, max_new_tokens=12,
                                          seed=8, params=params), first)

  def test_eos_stops_only_its_row(self):
    model = _model(_tiny("qwen3"))
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5]]
    free = generate.generate(model, prompts, max_new_tokens=8)
    eos = free[0][2]
    got = generate.generate(model, prompts, max_new_tokens=8, eos_id=eos)
    for row, tokens in enumerate(free):
      want = tokens[:tokens.index(eos) + 1] if eos in tokens else tokens
      self.assertEqual(got[row], want)
    self.assertLessEqual(len(got[0]), 3)

  # deepseek3: stacked dense and expert blocks (decoding unstacks both).
  @parameterized.parameters("llama3", "deepseek3")
  def test_logprobs_equal_the_log_softmax_of_the_full_forward(self, family):
    model = _model(_tiny(family))
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5]]
    temperature = 1.5
    tokens, logprobs = generate.generate_with_logprobs(
        model, prompts, max_new_tokens=6, seed=2, pad_to=8,
        params=sampler.SamplingParams(temperature=temperature, top_k=20))
    for prompt, out, got in zip(prompts, tokens, logprobs):
      logits = np.asarray(_full_logits(model, jnp.asarray([prompt + out])),
                          np.float64)[0, len(prompt) - 1:-1] / temperature
      shifted = logits - logits.max(-1, keepdims=True)
      want = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
      np.testing.assert_allclose(
          got, want[np.arange(len(out)), out], atol=1e-5, rtol=1e-5)

  # deepseek3: dense and expert block groups, each stacked or a list.
  def test_stacked_and_unstacked_layers_generate_alike(self):
    stacked = _model(_tiny("deepseek3", scan_layers=True))
    unstacked = _model(_tiny("deepseek3", scan_layers=False))
    hf_weights.load_hf_weights(unstacked, hf_weights.to_hf_weights(stacked))
    prompts = [[5, 1, 8, 60, 33, 2], [3, 9]]
    self.assertEqual(
        generate.generate(unstacked, prompts, max_new_tokens=8),
        generate.generate(stacked, prompts, max_new_tokens=8))

  def test_any_stop_token_stops_its_row(self):
    model = _model(_tiny("qwen3"))
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5]]
    free = generate.generate(model, prompts, max_new_tokens=8)
    stops = (free[0][3], free[1][1])
    got, logprobs = generate.generate_with_logprobs(
        model, prompts, max_new_tokens=8, stop_ids=stops)
    for row, tokens in enumerate(free):
      end = min([tokens.index(s) + 1 for s in stops if s in tokens])
      self.assertEqual(got[row], tokens[:end])
      self.assertLen(logprobs[row], end)
    self.assertLessEqual(len(got[1]), 2)

  def test_suppressed_tokens_are_never_generated(self):
    model = _model(_tiny("llama3"))
    prompt = [1, 2, 3]
    free = generate.generate(model, [prompt], max_new_tokens=6)[0]
    got, _ = generate.generate_with_logprobs(
        model, [prompt], max_new_tokens=6, suppress_ids=(free[0],))
    self.assertNotIn(free[0], got[0])
    self.assertNotEqual(got[0][0], free[0])

  def test_prompts_of_one_bucket_share_a_compilation(self):
    model = _model(_tiny("llama3"))
    prompts = [list(range(1, length + 1)) for length in (3, 5, 8)]
    loop = generate._generate  # pylint: disable=protected-access
    before = loop._cache_size()  # pylint: disable=protected-access
    padded = [generate.generate_with_logprobs(
        model, [prompt], max_new_tokens=3, pad_to=8)[0] for prompt in prompts]
    after = loop._cache_size()  # pylint: disable=protected-access
    self.assertEqual(after, before + 1)
    self.assertEqual(padded, [generate.generate(model, [prompt],
                                                max_new_tokens=3)
                              for prompt in prompts])

  def test_bad_arguments(self):
    model = _model(_tiny("qwen3"))
    with self.assertRaisesRegex(ValueError, "max_new_tokens=0"):
      generate.generate(model, [[1]], max_new_tokens=0)
    with self.assertRaisesRegex(ValueError, "at least one token"):
      generate.generate(model, [[1], []], max_new_tokens=2)
    with self.assertRaisesRegex(ValueError, "top_p=0"):
      generate.generate(model, [[1]], max_new_tokens=2,
                        params=sampler.SamplingParams(top_p=0.0))
    with self.assertRaisesRegex(ValueError, "pad_to=0"):
      generate.generate_with_logprobs(model, [[1]], max_new_tokens=2,
                                      pad_to=0)

if __name__ == "__main__":
  absltest.main()
