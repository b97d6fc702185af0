"""Checks of a `ModelConfig`'s parts: experts, global layer sizes, MLA and
MTP, and the choices they validate against.

Each check takes the config being built (`self` of
`ModelConfig.__post_init__`, named so here) and raises `ValueError` naming
the field, its value and what would be valid (`fail`).
"""

from typing import Any

# "gqa": maxtext.layers.attention; "mla": maxtext.layers.mla (DeepSeek).
ATTENTION_TYPES = ("gqa", "mla")
# Mixture of experts (maxtext.layers.moe).
ROUTER_SCORES = ("softmax", "sigmoid")
MOE_IMPLS = ("dropless", "capacity", "dense")


def fail(field: str, value: Any, valid: str) -> None:
  """Raises the error of a bad `ModelConfig` field."""
  raise ValueError(f"ModelConfig.{field}={value!r} is invalid: {valid}.")


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
