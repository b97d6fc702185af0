"""Tests of the built-in rollout engine on a tiny random model.

Greedy rollouts equal `generate`'s (the padding token suppressed); the
sampler's log-probs equal the engine's scoring of the same completions
(what the learner's old-policy log-probs use); new weights reach the
rollout without a copy on a shared mesh, and are copied onto a separate
rollout mesh (2 CPU devices:
JAX_NUM_CPU_DEVICES=2).
"""

import tempfile

from absl.testing import absltest
from flax import nnx
import jax
import numpy as np
from tunix.generate import tokenizer_adapter
from tunix.rl.rollout import base_rollout

from maxtext.data import tokenizer as tokenizer_lib
from maxtext.inference import generate
from maxtext.models import registry
from maxtext.rl import jax_rollout
from maxtext.rl import policy
from maxtext.rl import toy_task
from testing import devices
from testing import tiny_configs
from testing import trees

_PROMPTS = ["1 + 2 =", "3 + 4 = #### 7 </s> 5 + 1 =", "0 + 0 ="]


def _policy(seed: int = 0) -> policy.PolicyModel:
  cfg = tiny_configs.tiny_model_config("llama3", window=0, vocab_size=16)
  return policy.PolicyModel(
      registry.create_model(cfg, rngs=nnx.Rngs(seed)))


def _config(**changes) -> base_rollout.RolloutConfig:
  values = dict(max_tokens_to_generate=5, temperature=0.0,
                max_prompt_length=8, eos_tokens=None)
  values.update(changes)
  return base_rollout.RolloutConfig(**values)


class JaxRolloutTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    path, _ = toy_task.write_task(tempfile.mkdtemp())
    cls.tokenizer = policy.RlTokenizer(tokenizer_lib.load_tokenizer(path))
    cls.adapter = tokenizer_adapter.TokenizerAdapter(cls.tokenizer)
    cls.mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))

  def _rollout(self, model, mesh=None, **changes):
    return jax_rollout.JaxRollout(
        model, self.adapter, self.mesh if mesh is None else mesh,
        _config(**changes), pad_to=4)

  def test_greedy_rollouts_equal_generate(self):
    model = _policy()
    rollout = self._rollout(model)
    out = rollout.generate(_PROMPTS, _config())
    eos = self.tokenizer.eos_id()
    for row, prompt in enumerate(_PROMPTS):
      ids = self.tokenizer.encode(prompt)[-8:]
      # The toy tokenizer pads with "<pad>", which rollouts never sample.
      want = generate.generate_with_logprobs(
          model.decoder, [ids], max_new_tokens=5, stop_ids=(eos,),
          suppress_ids=(self.tokenizer.pad_id(),))[0][0]
      self.assertEqual(out.tokens[row].tolist(), want)
      self.assertEqual(out.left_padded_prompt_tokens[row].tolist(),
                       [self.tokenizer.pad_id()] * (8 - len(ids)) + ids)
      text_ids = want[:-1] if want[-1] == eos else want
      self.assertEqual(out.text[row], self.tokenizer.decode(text_ids))

  def test_sampled_logprobs_equal_the_scored_ones(self):
    temperature = 1.3
    rollout = self._rollout(_policy(), temperature=temperature)
    out = rollout.generate(_PROMPTS, _config(temperature=temperature,
                                             top_k=8, seed=3))
    pad = self.tokenizer.pad_id()
    completions_BT = np.full((len(_PROMPTS), 5), pad, np.int32)
    for row, tokens in enumerate(out.tokens):
      completions_BT[row, :len(tokens)] = tokens
    scored_BT = np.asarray(rollout.get_per_token_logps(
        out.left_padded_prompt_tokens, completions_BT))
    for row, logprobs in enumerate(out.logprobs):
      trees.assert_close(scored_BT[row, :len(logprobs)], logprobs,
                         rtol=1e-5, atol=1e-5, scaled_atol=1e-5)

  def test_new_weights_reach_the_rollout_without_a_copy(self):
    model, other = _policy(0), _policy(1)
    rollout = self._rollout(model)
    before = rollout.generate(_PROMPTS, _config())
    new = nnx.state(other, nnx.Param)
    rollout.update_params(new, (nnx.Param,))
    after = rollout.generate(_PROMPTS, _config())
    want = self._rollout(other).generate(_PROMPTS, _config())
    self.assertEqual([t.tolist() for t in after.tokens],
                     [t.tolist() for t in want.tokens])
    self.assertNotEqual([t.tolist() for t in after.tokens],
                        [t.tolist() for t in before.tokens])
    for got, given in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                          jax.tree.leaves(new)):
      self.assertIs(got, given)

  def test_a_separate_rollout_mesh_gets_a_copy(self):
    devices.require_devices(2)
    trainer_mesh = self.mesh
    rollout_mesh = jax.sharding.Mesh(np.array(jax.devices()[1:2]),
                                     ("data",))
    replicated = jax.sharding.NamedSharding(trainer_mesh,
                                            jax.sharding.PartitionSpec())
    model = _policy()
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.device_put(state, replicated))
    rollout = self._rollout(model, rollout_mesh)
    for leaf in jax.tree.leaves(nnx.state(rollout.model())):
      self.assertEqual(leaf.sharding.mesh, rollout_mesh)
    self.assertEqual(
        [t.tolist() for t in rollout.generate(_PROMPTS, _config()).tokens],
        [t.tolist() for t in self._rollout(model).generate(
            _PROMPTS, _config()).tokens])
    other = _policy(1)
    new = jax.device_put(nnx.state(other, nnx.Param), replicated)
    rollout.update_params(new, (nnx.Param,))
    got = jax.tree.leaves(nnx.state(rollout.model(), nnx.Param))
    for leaf, want in zip(got, jax.tree.leaves(new)):
      self.assertEqual(leaf.sharding.mesh, rollout_mesh)
      np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want))

  def test_bad_settings(self):
    with self.assertRaisesRegex(ValueError, "rollout.pad_to=0"):
      jax_rollout.JaxRollout(_policy(), self.adapter, self.mesh, _config(),
                             pad_to=0)


if __name__ == "__main__":
  absltest.main()
