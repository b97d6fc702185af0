"""Rematerialisation policies by name, for `jax.checkpoint` on a block.

A policy decides which activations of a decoder block the backward pass keeps
from the forward pass and which it recomputes. Named activations are tagged
with `jax.ad_checkpoint.checkpoint_name` in the layers (see
`maxtext.layers.attention` and `maxtext.layers.mlp`; the names are
`REMAT_NAMES`).

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
  custom               per name: "keep" (in device memory), "offload" (saved
                       in host memory, "pinned_host", and brought back for
                       the backward pass) or "recompute" (the default), from
                       `RematConfig.custom`. Offloading needs a backend
                       whose devices have pinned host memory (TPU, GPU; CPU
                       too with jax 0.10); otherwise an error names the
                       backend.

`compiled_memory` reports the memory XLA plans for a jitted function, to
compare policies (`temp_bytes` is what remat trades against recomputation).

`RematConfig` is the `remat` config section: not architecture (a model's
outputs and gradients do not depend on it), so it is not in `ModelConfig`.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any

import jax

from maxtext.common import sections

POLICIES = ("none", "full", "minimal", "save_dot_except_mlp",
            "save_qkv_proj", "save_out_proj", "nothing_saveable", "custom")
# Activations of a block tagged with `checkpoint_name` (attention, mlp), and
# what the "custom" policy can do with each.
REMAT_NAMES = ("query_proj", "key_proj", "value_proj", "attention_context",
               "out_proj", "mlp_gate", "mlp_up", "mlp_hidden", "mlp_out")
REMAT_ACTIONS = ("keep", "recompute", "offload")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RematConfig:
  """The `remat` config section: what the backward pass of each block
  recomputes.

  Attributes:
    policy: One of `POLICIES` (module docstring); "none" keeps every
      activation, "custom" follows `custom`.
    custom: For policy="custom": activation name (`REMAT_NAMES`) ->
      "keep", "recompute" or "offload" (saved in host memory). A mapping or
      pairs are accepted; stored as sorted (name, action) pairs without the
      "recompute" ones (the default for unlisted names).
  """

  policy: str = "none"
  custom: Any = ()

  def __post_init__(self):
    sections.check_choice("remat.policy", self.policy, POLICIES)
    custom = self.custom
    if hasattr(custom, "to_dict"):
      custom = custom.to_dict()
    if isinstance(custom, Mapping):
      custom = tuple(custom.items())
    try:
      pairs = {name: action for name, action in custom}
    except (TypeError, ValueError):
      raise ValueError(f"remat.custom={self.custom!r} must map activation"
                       " names to actions.") from None
    for name, action in pairs.items():
      if name not in REMAT_NAMES:
        raise ValueError(f"remat.custom: {name!r} is not an activation name;"
                         f" valid: {REMAT_NAMES}.")
      if action not in REMAT_ACTIONS:
        raise ValueError(f"remat.custom: {name!r}: {action!r} is not an"
                         f" action; valid: {REMAT_ACTIONS}.")
    pairs = tuple(sorted((n, a) for n, a in pairs.items()
                         if a != "recompute"))
    if pairs and self.policy != "custom":
      raise ValueError(f'remat.custom={self.custom!r}: only policy="custom"'
                       f" reads it, not remat.policy={self.policy!r}.")
    object.__setattr__(self, "custom", pairs)

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


def custom_policy(actions: Sequence[tuple[str, str]]) -> Callable:
  """The policy of (activation name, "keep"|"offload"|"recompute") pairs.

  Raises:
    ValueError: an activation is offloaded but the default backend's devices
      have no "pinned_host" memory (the message names the backend).
  """
  keep = [name for name, action in actions if action == "keep"]
  offload = [name for name, action in actions if action == "offload"]
  if offload:
    device = jax.devices()[0]
    kinds = [m.kind for m in device.addressable_memories()]
    if "pinned_host" not in kinds:
      raise ValueError(
          f"remat.custom offloads {offload}, which needs \"pinned_host\""
          f" memory; {device.platform} devices have {kinds}. Use \"keep\" or"
          " \"recompute\" on this backend.")
  return jax.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=keep, names_which_can_be_offloaded=offload,
      offload_src="device", offload_dst="pinned_host")


def remat(fn: Callable, policy_name: str, *, prevent_cse: bool = True,
          custom: Sequence[tuple[str, str]] = ()) -> Callable:
  """`fn` under `jax.checkpoint` with the named policy (`none`: `fn`).

  Args:
    fn: The function to rematerialise.
    policy_name: One of `POLICIES`.
    prevent_cse: Passed to `jax.checkpoint` (False inside a scan).
    custom: (name, action) pairs of the "custom" policy.

  Raises:
    ValueError: unknown policy; the message lists the valid ones.
  """
  if policy_name == "none":
    return fn
  if policy_name == "custom":
    policy = custom_policy(custom)
  elif policy_name in _POLICIES:
    policy = _POLICIES[policy_name]
  else:
    raise ValueError(f"Unknown remat policy {policy_name!r}; valid policies:"
                     f" {list(POLICIES)}.")
  return jax.checkpoint(fn, policy=policy, prevent_cse=prevent_cse)


def compiled_memory(fn: Callable, *args: Any) -> dict[str, int]:
  """Bytes XLA plans for `jax.jit(fn)(*args)`, per kind.

  Returns:
    `argument_bytes`, `output_bytes`, `alias_bytes`, `temp_bytes` (scratch
    and live intermediates: what remat reduces) and `host_temp_bytes`
    (offloaded activations), from `compiled.memory_analysis()`.
  """
  stats = jax.jit(fn).lower(*args).compile().memory_analysis()
  return {"argument_bytes": stats.argument_size_in_bytes,
          "output_bytes": stats.output_size_in_bytes,
          "alias_bytes": stats.alias_size_in_bytes,
          "temp_bytes": stats.temp_size_in_bytes,
          "host_temp_bytes": stats.host_temp_size_in_bytes}
