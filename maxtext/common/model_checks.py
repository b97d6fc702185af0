"""Checks of a `ModelConfig`'s parts: pipeline, experts, MLA, MTP and the
custom remat policy, and the choices they validate against.

Each check takes the config being built (`self` of
`ModelConfig.__post_init__`, named so here) and raises `ValueError` naming
the field, its value and what would be valid (`fail`).
"""

from collections.abc import Mapping
from typing import Any

# "gqa": maxtext.layers.attention; "mla": maxtext.layers.mla (DeepSeek).
ATTENTION_TYPES = ("gqa", "mla")
# Activations of a block tagged with `checkpoint_name` (attention, mlp), and
# what the "custom" remat policy can do with each (maxtext.layers.remat).
REMAT_NAMES = ("query_proj", "key_proj", "value_proj", "attention_context",
               "out_proj", "mlp_gate", "mlp_up", "mlp_hidden", "mlp_out")
REMAT_ACTIONS = ("keep", "recompute", "offload")
# Mixture of experts (maxtext.layers.moe).
ROUTER_SCORES = ("softmax", "sigmoid")
MOE_IMPLS = ("dropless", "capacity", "dense")


def fail(field: str, value: Any, valid: str) -> None:
  """Raises the error of a bad `ModelConfig` field."""
  raise ValueError(f"ModelConfig.{field}={value!r} is invalid: {valid}.")


def normalize_remat_custom(self) -> None:
  """Stores `remat_custom` as sorted (name, action) pairs without the
  "recompute" ones; checks the names, the actions and the policy."""
  custom = self.remat_custom
  if hasattr(custom, "to_dict"):
    custom = custom.to_dict()
  if isinstance(custom, Mapping):
    custom = tuple(custom.items())
  try:
    pairs = {name: action for name, action in custom}
  except (TypeError, ValueError):
    fail("remat_custom", self.remat_custom,
          "must map activation names to actions")
  for name, action in pairs.items():
    if name not in REMAT_NAMES:
      fail("remat_custom", self.remat_custom,
            f"{name!r} is not an activation name; valid: {REMAT_NAMES}")
    if action not in REMAT_ACTIONS:
      fail("remat_custom", self.remat_custom,
            f"{name!r}: {action!r} is not an action; valid: "
            f"{REMAT_ACTIONS}")
  pairs = tuple(sorted((n, a) for n, a in pairs.items()
                       if a != "recompute"))
  if pairs and self.remat_policy != "custom":
    fail("remat_custom", self.remat_custom,
          f'only remat_policy="custom" reads it, not '
          f"{self.remat_policy!r}")
  object.__setattr__(self, "remat_custom", pairs)

def check_pipeline(self) -> None:
  """The pipeline fields: stages, microbatches, repeats and what they
  divide."""
  stages = self.pipeline_stages
  if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
    fail("pipeline_stages", stages,
          "must be a positive integer (the size of the 'stage' mesh axis;"
          " that axis cannot be -1 with pipelining)")
  microbatches = self.pipeline_microbatches
  if (isinstance(microbatches, bool) or not isinstance(microbatches, int)
      or microbatches < 0):
    fail("pipeline_microbatches", microbatches,
          "must be a positive integer, or 0 for one per stage")
  repeats = self.pipeline_repeats
  if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
    fail("pipeline_repeats", repeats,
          "must be a positive integer (1: GPipe)")
  if stages == 1:
    return
  if self.num_layers % stages:
    fail("pipeline_stages", stages,
          f"must divide num_layers={self.num_layers}")
  if self.num_layers % (stages * repeats):
    valid = [r for r in range(1, self.num_layers // stages + 1)
             if self.num_layers % (stages * r) == 0]
    fail("pipeline_repeats", repeats,
          f"pipeline_stages={stages} * pipeline_repeats must divide"
          f" num_layers={self.num_layers}; valid repeats: {valid}")
  if repeats > 1 and 0 < microbatches < stages:
    fail("pipeline_microbatches", microbatches,
          f"the circular schedule (pipeline_repeats={repeats}) needs at"
          f" least pipeline_stages={stages} microbatches, or 0 for one"
          " per stage")
  if not self.scan_layers:
    fail("pipeline_stages", stages, "pipelining needs scan_layers=True")

def check_moe(self) -> None:
  """The mixture-of-experts fields (only set with num_experts > 0)."""
  for name in ("num_experts", "num_shared_experts", "first_dense_layers",
               "moe_mlp_dim"):
    value = getattr(self, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      fail(name, value, "must be an integer >= 0")
  interval = self.moe_layer_interval
  if isinstance(interval, bool) or not isinstance(interval, int) or (
      interval < 1):
    fail("moe_layer_interval", interval, "must be a positive integer")
  expert_flags = ("router_logit_bias", "expert_bias",
                  "expert_gate_up_fused")
  for name in expert_flags:
    if not isinstance(getattr(self, name), bool):
      fail(name, getattr(self, name), "must be True or False")
  if not self.num_experts:
    for name in ("num_shared_experts", "first_dense_layers") + expert_flags:
      if getattr(self, name):
        fail("num_experts", self.num_experts,
              f"must be positive when {name} is set")
    if interval != 1:
      fail("num_experts", self.num_experts,
            "must be positive when moe_layer_interval is set")
    return
  for name, valid in (("router_score", ROUTER_SCORES),
                      ("moe_impl", MOE_IMPLS)):
    if getattr(self, name) not in valid:
      fail(name, getattr(self, name), f"valid values are {valid}")
  for name in ("router_normalize", "router_bias"):
    if not isinstance(getattr(self, name), bool):
      fail(name, getattr(self, name), "must be True or False")
  if self.moe_mlp_dim < 1:
    fail("moe_mlp_dim", self.moe_mlp_dim,
          "must be positive when num_experts > 0")
  if not 1 <= self.num_experts_per_token <= self.num_experts:
    fail("num_experts_per_token", self.num_experts_per_token,
          f"must be in [1, num_experts={self.num_experts}]")
  if self.first_dense_layers >= self.num_layers:
    fail("first_dense_layers", self.first_dense_layers,
          f"must be below num_layers={self.num_layers}")
  if not any(self.moe_layer(i) for i in range(self.num_layers)):
    fail("moe_layer_interval", interval,
          f"leaves no expert layer among layers {self.first_dense_layers}.."
          f"{self.num_layers - 1} (layer i has experts when (i + 1) % "
          "moe_layer_interval == 0)")
  groups = self.num_expert_groups
  if groups < 1 or self.num_experts % groups:
    fail("num_expert_groups", groups,
          f"must be a positive divisor of num_experts={self.num_experts}")
  if not 1 <= self.expert_groups_per_token <= groups:
    fail("expert_groups_per_token", self.expert_groups_per_token,
          f"must be in [1, num_expert_groups={groups}]")
  if (groups > 1 and self.expert_groups_per_token * self.num_experts
      // groups < self.num_experts_per_token):
    fail("expert_groups_per_token", self.expert_groups_per_token,
          "its groups hold fewer experts than num_experts_per_token="
          f"{self.num_experts_per_token}")
  for name in ("routed_scaling_factor", "capacity_factor"):
    if getattr(self, name) <= 0:
      fail(name, getattr(self, name), "must be positive")
  for name in ("load_balance_loss_weight", "router_z_loss_weight",
               "router_bias_update_rate"):
    if getattr(self, name) < 0:
      fail(name, getattr(self, name), "must be >= 0 (0 turns it off)")
  if self.router_bias_update_rate and not self.router_bias:
    fail("router_bias_update_rate", self.router_bias_update_rate,
          "needs router_bias=True (there is no bias to move); set"
          " router_bias or use 0")
  if self.pipeline_stages > 1:
    fail("pipeline_stages", self.pipeline_stages,
          "pipelining is not supported with experts (num_experts="
          f"{self.num_experts}); use 1")

def check_global_sizes(self) -> None:
  """`global_head_dim` and `global_num_kv_heads`: a global layer's own
  attention sizes (0: the model's)."""
  for name in ("global_head_dim", "global_num_kv_heads"):
    value = getattr(self, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      fail(name, value, "must be an integer >= 0 (0: the model's)")
  if self.global_head_dim % 2:
    fail("global_head_dim", self.global_head_dim,
          "must be even (rotary embeddings)")
  if self.global_num_kv_heads and self.num_heads % self.global_num_kv_heads:
    fail("global_num_kv_heads", self.global_num_kv_heads,
          f"must divide num_heads={self.num_heads}")
  name = ("global_head_dim" if self.global_head_dim else
          "global_num_kv_heads" if self.global_num_kv_heads else None)
  if name is None:
    return
  if self.sliding_window == 0 or self.global_layer_interval == 0:
    fail(name, getattr(self, name),
          "sets the global layers' attention apart from the local ones', "
          "but every layer is "
          + ("global" if self.sliding_window == 0 else "local")
          + "; set head_dim and num_kv_heads instead, or use 0")
  if self.attention_type != "gqa":
    fail(name, getattr(self, name),
          f'serves attention_type="gqa" only, not {self.attention_type!r};'
          " use 0")
  if self.pipeline_stages > 1:
    fail("pipeline_stages", self.pipeline_stages,
          f"pipelining runs one layer kind; {name} makes global layers a "
          "kind of their own; use 1")


def check_mla(self) -> None:
  """The multi-head latent attention fields (only read with
  attention_type="mla")."""
  if self.attention_type not in ATTENTION_TYPES:
    fail("attention_type", self.attention_type,
          f"valid values are {ATTENTION_TYPES}")
  mla_fields = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                "v_head_dim")
  for name in mla_fields:
    value = getattr(self, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      fail(name, value, "must be an integer >= 0")
  if not isinstance(self.rope_interleave, bool):
    fail("rope_interleave", self.rope_interleave, "must be True or False")
  if self.attention_type != "mla":
    for name in mla_fields + ("rope_interleave",):
      if getattr(self, name):
        fail(name, getattr(self, name),
              f'only attention_type="mla" reads it, not '
              f"{self.attention_type!r}; leave it at its default")
    return
  for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
    if getattr(self, name) < 1:
      fail(name, getattr(self, name),
            'must be positive with attention_type="mla"')
  if self.num_kv_heads != self.num_heads:
    fail("num_kv_heads", self.num_kv_heads,
          f'must equal num_heads={self.num_heads} with attention_type='
          '"mla" (every head has its own keys and values)')
  for name in ("qk_norm", "qkv_bias", "sliding_window"):
    if getattr(self, name):
      fail(name, getattr(self, name),
            'is not supported with attention_type="mla"')

def check_mtp(self) -> None:
  """The multi-token prediction fields."""
  value = self.mtp_layers
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    fail("mtp_layers", value, "must be an integer >= 0 (0 is off)")
  if self.mtp_loss_weight < 0:
    fail("mtp_loss_weight", self.mtp_loss_weight, "must be >= 0")
  if value and self.pipeline_stages > 1:
    fail("mtp_layers", value,
          "multi-token prediction is not supported with pipeline_stages="
          f"{self.pipeline_stages}; use 0")
