"""The built-in rollout engine: our own jitted generation loop
(`maxtext.inference.generate`) behind Tunix's `BaseRollout`.

Tunix's `RLCluster` builds it (`ClusterConfig.rollout_engine` =
`functools.partial(JaxRollout, pad_to=...)`) with the policy model, the
tokenizer, the rollout mesh and the rollout config:

- `generate` encodes the prompts (the last `max_prompt_length` tokens),
  pads them up to a multiple of `pad_to` (one compilation per bucket of
  prompt lengths, per batch and `max_tokens_to_generate`), samples with the
  config's temperature, top-k and top-p (never the padding token, unless it
  is the EOS) until an EOS (`eos_tokens`, default the tokenizer's) and
  returns the tokens (the stop token kept), their text (without it), their
  log-probabilities and the left-padded prompts.
- `get_per_token_logps` scores completions with the rollout's weights at the
  sampling temperature (as the learner scores them).
- `update_params` takes the policy's new weights: in place, no copy, when
  the rollout shares the trainer's mesh (then the rollout model is the
  policy itself); otherwise resharded onto the rollout mesh.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import time
from typing import Any

from flax import nnx
import jax
import numpy as np
from tunix.rl.rollout import base_rollout

from maxtext.inference import generate as generate_lib
from maxtext.inference import sampler
from maxtext.rl import rollout_base


def _shardings_on(mesh: jax.sharding.Mesh, tree: Any) -> Any:
  """The shardings of `tree`'s arrays with their partition specs on
  `mesh`."""
  return jax.tree.map(
      lambda x: jax.sharding.NamedSharding(mesh, x.sharding.spec), tree)


def _mesh_of(tree: Any) -> jax.sharding.Mesh | None:
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf.sharding, jax.sharding.NamedSharding):
      return leaf.sharding.mesh
  return None


class JaxRollout(rollout_base.PolicyRollout):
  """Rollouts with `maxtext.inference.generate` (see the module docstring)."""

  def __init__(self, rollout_actor: nnx.Module, tokenizer: Any,
               mesh: jax.sharding.Mesh,
               rollout_config: base_rollout.RolloutConfig, *,
               pad_to: int = 16, seed: int = 0):
    """Builds the engine.

    Args:
      rollout_actor: The policy (`maxtext.rl.policy.PolicyModel`).
      tokenizer: Tunix's `TokenizerAdapter` of an `RlTokenizer`.
      mesh: The rollout mesh; the policy is copied onto it when it lives on
        another one.
      rollout_config: Sampling settings; its temperature also scores
        `get_per_token_logps`.
      pad_to: Prompt lengths are padded to a multiple of this.
      seed: Seed of the first `generate`; each later call uses the next one
        unless the rollout config sets a seed.
    """
    if pad_to < 1:
      raise ValueError(f"rollout.pad_to={pad_to} must be >= 1.")
    self.mesh = mesh
    self._tokenizer = tokenizer
    self._config = rollout_config
    self._pad_to = pad_to
    self._seed = seed
    state = nnx.state(rollout_actor)
    if mesh is None or mesh.empty or _mesh_of(state) in (None, mesh):
      self._policy = rollout_actor
    else:
      graphdef, state = nnx.split(rollout_actor)
      self._policy = nnx.merge(
          graphdef, jax.device_put(state, _shardings_on(mesh, state)))

  def generate(self, prompts: list[str],
               rollout_config: base_rollout.RolloutConfig,
               **kwargs) -> base_rollout.RolloutOutput:
    """Samples one completion per prompt (see the module docstring)."""
    del kwargs
    config = rollout_config
    max_prompt = config.max_prompt_length
    prompt_ids = self._encode_prompts(prompts, max_prompt)
    params = sampler.SamplingParams(
        temperature=config.temperature,
        top_k=config.top_k if config.top_k and config.top_k > 0 else 0,
        top_p=1.0 if config.top_p is None else config.top_p)
    stop_ids = tuple(config.eos_tokens or (self.eos_id(),))
    # A padding token inside a completion would read as its end.
    suppress_ids = () if self.pad_id() in stop_ids else (self.pad_id(),)
    if config.seed is None:
      seed = self._seed
      self._seed += 1
    else:
      seed = int(np.asarray(config.seed).ravel()[0])
    start = time.perf_counter()
    tokens, logprobs = generate_lib.generate_with_logprobs(
        self._policy.decoder, prompt_ids,
        max_new_tokens=config.max_tokens_to_generate, params=params,
        stop_ids=stop_ids, suppress_ids=suppress_ids, seed=seed,
        pad_to=self._pad_to)
    elapsed = time.perf_counter() - start
    return self._output([np.asarray(t, np.int32) for t in tokens],
                        [self._text(t, stop_ids) for t in tokens], logprobs,
                        prompt_ids, max_prompt, elapsed)

  def update_params(self, params: Any, filter_types: Any = None) -> None:
    """Takes the policy's new weights `params` (a state of its variables,
    of `filter_types`), resharded onto the rollout mesh if it differs."""
    del filter_types
    target = _mesh_of(nnx.state(self._policy))
    if target is not None and _mesh_of(params) not in (None, target):
      params = jax.device_put(params, _shardings_on(target, params))
    nnx.update(self._policy, params)
