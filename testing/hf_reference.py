"""Test helper: our logits vs Hugging Face transformers' on the same weights.

Test-only (imports torch); library code never imports this module.
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers.core_model_loading import revert_weight_conversion

from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.models import execution
from maxtext.models import hf_weights
from maxtext.models import registry


def random_hf_model(model_class, hf_config, *, norm_mean: float,
                    seed: int = 0, std: float = 0.1) -> torch.nn.Module:
  """A float32 Hugging Face model with random parameters.

  Args:
    model_class: e.g. `transformers.LlamaForCausalLM`.
    hf_config: Its config.
    norm_mean: Mean of the norm weights (1-D parameters): 1.0 where the norm
      multiplies by the weight, 0.0 where by `1 + weight` (Gemma).
    seed: torch seed.
    std: Standard deviation of every parameter.
  """
  torch.manual_seed(seed)
  model = model_class(hf_config).float().eval()
  with torch.no_grad():
    for parameter in model.parameters():
      parameter.normal_(norm_mean if parameter.ndim == 1 else 0.0, std)
  return model


def parameter_counts(cfg: ModelConfig, hf_class, hf_config) -> tuple[int, int]:
  """(Our model's parameters, transformers' `hf_class(hf_config)`'s), both
  built without memory (transformers counts a tied output head once)."""
  model = nnx.eval_shape(lambda: registry.create_model(cfg,
                                                       rngs=nnx.Rngs(0)))
  ours = sum(math.prod(p.shape) for p in
             jax.tree.leaves(nnx.state(model, nnx.Param)))
  with torch.device("meta"):
    hf_model = hf_class(hf_config)
  return ours, sum(p.numel() for p in hf_model.parameters())


def image_text_logits(model: nnx.Module, tokens_BL: np.ndarray,
                      pixels_Bvhwe: np.ndarray) -> np.ndarray:
  """A vision-language model's float32 logits [B, L, V] of token rows and
  each row's images (jitted)."""
  return np.asarray(nnx.jit(lambda m, t, i: m(t, images_Bvhwe=i))(
      model, jnp.asarray(tokens_BL), jnp.asarray(pixels_Bvhwe)))


def state_dict(hf_model: torch.nn.Module) -> dict[str, np.ndarray]:
  """The model's tensors as its checkpoints store them (`save_pretrained`):
  transformers >= 5 fuses some in memory (e.g. the experts of MoE models)."""
  tensors = revert_weight_conversion(hf_model, hf_model.state_dict())
  return {name: tensor.contiguous().numpy()
          for name, tensor in tensors.items()}


def assert_round_trip(hf_model: torch.nn.Module, cfg: ModelConfig,
                      **overrides) -> None:
  """HF weights -> our model -> `to_hf_weights` gives them back bit for bit.

  A tied model's `lm_head.weight` (the embedding again) is not exported.

  Args:
    hf_model: From `random_hf_model`.
    cfg: Our config of the same architecture (`model_config_from_hf`).
    **overrides: ModelConfig fields to change (scan_layers).
  """
  cfg = cfg.replace(**overrides)
  want = state_dict(hf_model)
  if cfg.tie_embeddings:
    np.testing.assert_array_equal(want.pop("lm_head.weight"),
                                  want["model.embed_tokens.weight"])
  got = hf_weights.to_hf_weights(hf_weights.model_from_hf_weights(cfg, want))
  assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
  for name, array in want.items():
    assert got[name].dtype == array.dtype, name
    np.testing.assert_array_equal(got[name], array, err_msg=name)


def max_logit_diff(hf_model: torch.nn.Module, cfg: ModelConfig,
                   tokens_BL: np.ndarray, *, attention_impl: str = "auto",
                   linear_chunk: int = 64, **overrides) -> float:
  """Largest |our logit - HF logit| with HF weights loaded into our model.

  Args:
    hf_model: From `random_hf_model`.
    cfg: Our config of the same architecture (`model_config_from_hf`).
    tokens_BL: Token ids.
    attention_impl: Our attention kernel (`attention_kernel.impl`).
    linear_chunk: Chunk of Gated DeltaNet layers (`attention_kernel`).
    **overrides: ModelConfig fields to change (scan_layers).
  """
  cfg = cfg.replace(**overrides)
  model = hf_weights.model_from_hf_weights(
      cfg, state_dict(hf_model), execution.Execution(
          attention_kernel=dispatch.Kernel(impl=attention_impl,
                                           linear_chunk=linear_chunk)))
  logits = nnx.jit(lambda m, t: m(t))(model, jnp.asarray(tokens_BL))
  with torch.no_grad():
    want = hf_model(torch.tensor(tokens_BL)).logits.numpy()
  assert logits.dtype == jnp.float32 and logits.shape == want.shape
  diff = float(np.abs(np.asarray(logits) - want).max())
  print(f"{cfg.family} {attention_impl} {overrides}: max |logit diff| ="
        f" {diff:.3g} (max |logit| {np.abs(want).max():.3g})")
  return diff
