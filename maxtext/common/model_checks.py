"""Checks of a `ModelConfig` that involve more than one of its parts (each
part checks its own fields where it is defined).

Each check takes the config being built (`self` of
`ModelConfig.__post_init__`, named so here) and raises `ValueError` naming
the section key, its value and what would be valid (`fail`).
"""

from typing import Any

from maxtext.common import layer_pattern as pattern_lib


def fail(field: str, value: Any, valid: str) -> None:
  """Raises the error of a bad key of the `model` section."""
  raise ValueError(f"ModelConfig.{field}={value!r} is invalid: {valid}.")


def check_expert_layers(self) -> None:
  """The pattern's expert layers (`first_dense_layers`,
  `moe_layer_interval`) against the experts and the layer count."""
  pattern, num_experts = self.pattern, self.moe.num_experts
  if not num_experts:
    if pattern.first_dense_layers:
      fail("num_experts", num_experts,
           "must be positive when first_dense_layers is set")
    if pattern.moe_layer_interval != 1:
      fail("num_experts", num_experts,
           "must be positive when moe_layer_interval is set")
    return
  if pattern.first_dense_layers >= self.num_layers:
    fail("first_dense_layers", pattern.first_dense_layers,
         f"must be below num_layers={self.num_layers}")
  if not any(self.moe_layer(i) for i in range(self.num_layers)):
    fail("moe_layer_interval", pattern.moe_layer_interval,
         f"leaves no expert layer among layers {pattern.first_dense_layers}"
         f"..{self.num_layers - 1} (layer i has experts when (i + 1) % "
         "moe_layer_interval == 0)")


def check_global_sizes(self) -> None:
  """A global layer's own attention sizes need global and local layers."""
  name = self.attention.global_sizes_key()
  if name is None:
    return
  pattern = self.pattern
  local = pattern.sliding_window or pattern.attention_chunk_size
  if not local or pattern.global_layer_interval == 0:
    fail(name, getattr(self.attention, name),
         "sets the global layers' attention apart from the local ones', "
         "but every layer is " + ("local" if local else "global")
         + "; set head_dim and num_kv_heads instead, or use 0")


def check_nope(self) -> None:
  """Temperature tuning serves the layers without rotary only."""
  attention = self.attention
  if attention.temperature_scale and not self.rope.global_nope:
    fail("attn_temperature_scale", attention.temperature_scale,
         "tunes the queries of layers without rotary, and there are none;"
         " set rope_global_nope=True or use 0")


def check_mla(self) -> None:
  """The latent sizes are read with attention_type="mla" only, and MLA's
  heads and unsupported options."""
  attention = self.attention
  if attention.type != "mla":
    self.mla.check_used()
    return
  self.mla.check_sizes(attention.head_dim)
  if attention.num_kv_heads != attention.num_heads:
    fail("num_kv_heads", attention.num_kv_heads,
         f"must equal num_heads={attention.num_heads} with attention_type="
         '"mla" (every head has its own keys and values)')
  for name, value in (
      ("qk_norm", attention.qk_norm), ("qkv_bias", attention.qkv_bias),
      ("qk_l2_norm", attention.qk_l2_norm),
      ("attention_k_eq_v", attention.k_eq_v),
      ("attention_value_norm", attention.value_norm),
      ("rope_global_fraction", (self.rope.global_fraction
                                if self.rope.global_fraction != 1.0 else 0)),
      ("attn_temperature_scale", attention.temperature_scale),
      ("rope_global_nope", self.rope.global_nope),
      ("rope_interleaved", self.rope.interleaved),
      ("sliding_window", self.pattern.sliding_window),
      ("attention_chunk_size", self.pattern.attention_chunk_size)):
    if value:
      fail(name, value, 'is not supported with attention_type="mla"')


def check_kv_sharing(self) -> None:
  """Layers that share keys and values need an earlier layer of their span
  to read them from, GQA attention, and `mlp_kv_shared_dim` needs them."""
  shared = self.pattern.kv_shared_layers
  if not shared:
    if self.mlp.kv_shared_dim:
      fail("mlp_kv_shared_dim", self.mlp.kv_shared_dim,
           "sizes the MLP of layers that share keys and values, and "
           "kv_shared_layers=0; use 0")
    return
  if shared >= self.num_layers:
    fail("kv_shared_layers", shared,
         f"must be below num_layers={self.num_layers} (the first layer "
         "computes its keys and values)")
  if self.attention.type != "gqa":
    fail("kv_shared_layers", shared,
         f'needs attention_type="gqa", not {self.attention.type!r}')
  spans = list(zip(self.layer_windows(),
                   self.pattern.chunks(self.num_layers)))
  first = self.num_layers - shared
  for (window, chunk), source in pattern_lib.kv_sources(spans,
                                                         first).items():
    if source is None:
      what = ("global" if window is None and chunk is None else
              f"sliding_window={window}" if window else f"chunk={chunk}")
      fail("kv_shared_layers", shared,
           f"leaves no layer before layer {first} with the span ({what}) "
           "of a layer that shares keys and values, to read them from")



def check_vision(self) -> None:
  """A vision tower's soft tokens need GQA attention (MLA takes no image
  blocks) and a decoder without per-layer inputs (whose embedding of the
  placeholder would not be replaced)."""
  if not self.vision.layers:
    return
  if self.attention.type != "gqa":
    fail("vision_layers", self.vision.layers,
         f'needs attention_type="gqa", not {self.attention.type!r}')
  if self.per_layer_input_dim:
    fail("vision_layers", self.vision.layers,
         "is not supported with per_layer_input_dim (use 0)")


def check_linear_attention(self) -> None:
  """Gated DeltaNet layers replace attention layers of a plain pattern: no
  sliding windows or chunks, shared keys and values, or vision tower
  beside them."""
  if not self.linear_attention.num_key_heads:
    return
  heads = self.linear_attention.num_key_heads
  for key, value in (("sliding_window", self.pattern.sliding_window),
                     ("attention_chunk_size",
                      self.pattern.attention_chunk_size),
                     ("kv_shared_layers", self.pattern.kv_shared_layers),
                     ("vision_layers", self.vision.layers)):
    if value:
      fail(key, value, f"is not supported with Gated DeltaNet layers "
           f"(linear_num_key_heads={heads}); use 0")


def check_partial_rotary(self) -> None:
  """A partial rotary rotates an even, non-zero number of dimensions."""
  factor = self.rope.partial_factor
  if factor == 1.0:
    return
  for head_dim in {self.attention.head_dim,
                   self.attention.global_head_dim or self.attention.head_dim}:
    rotated = self.rope.rotated_dim(head_dim)
    if rotated < 2 or rotated % 2:
      fail("rope_partial_factor", factor,
           f"rotates {rotated} of head_dim={head_dim} dimensions; it must "
           "rotate an even number >= 2")
