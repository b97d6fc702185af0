"""Rematerialisation policies by name, for `jax.checkpoint` on a block.

A policy decides which activations of a decoder block the backward pass keeps
from the forward pass and which it recomputes. Named activations are tagged
with `jax.ad_checkpoint.checkpoint_name` in the layers (see
`maxtext.layers.attention` and `maxtext.layers.mlp`).

  none                 no remat: every activation is kept (fastest, most
                       memory).
  full                 recompute the whole block; only its input is kept.
  minimal              keep matmul outputs without batch dimensions (the
                       projections), recompute the rest.
  save_dot_except_mlp  keep the attention projections and context, recompute
                       the MLP.
  save_qkv_proj        keep the query/key/value projections only.
  save_out_proj        keep the attention output projection only.
  nothing_saveable     keep nothing (same memory as `full`).
"""

from collections.abc import Callable

import jax

from maxtext.common import model_config

_POLICIES: dict[str, Callable | None] = {
    "full": None,
    "minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "save_dot_except_mlp": jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj", "attention_context",
        "out_proj"),
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj"),
    "save_out_proj": jax.checkpoint_policies.save_only_these_names("out_proj"),
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
}


def remat(fn: Callable, policy_name: str, *, prevent_cse: bool = True
          ) -> Callable:
  """`fn` under `jax.checkpoint` with the named policy (`none`: `fn`).

  Raises:
    ValueError: unknown policy; the message lists the valid ones.
  """
  if policy_name == "none":
    return fn
  if policy_name not in _POLICIES:
    raise ValueError(f"Unknown remat policy {policy_name!r}; valid policies:"
                     f" {list(model_config.REMAT_POLICIES)}.")
  return jax.checkpoint(fn, policy=_POLICIES[policy_name],
                        prevent_cse=prevent_cse)
