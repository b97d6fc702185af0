"""Vision towers for vision-language models: the SigLIP encoder and the
pooling projector that turns its patches into a decoder's soft tokens
(Gemma 3), or Llama 4's encoder and pixel-shuffle projector.

`VisionEncoder`: an image [h, w, e] is cut into patches of p x p pixels
(a projection of each patch, one token per patch, t = (h / p)^2), plus a
learned position embedding, then `layers` pre-norm encoder layers
(LayerNorm, bidirectional multi-head attention with biases, LayerNorm,
fc1 -> activation -> fc2 with biases), then a final LayerNorm: [v, t, d]
for v images (SigLIP as in transformers' `SiglipVisionModel` without its
pooling head).

`PoolingProjector` (Gemma 3's multimodal projector): the patch grid
averaged in square windows down to `tokens_per_image` tokens, RMS-normed
(`1 + scale`) and projected to the decoder's width: [v, u, D].

With `arch="llama4"` (transformers' `Llama4VisionModel`) the encoder's
patch projection has no bias and reads each patch channel-major, a learned
class token is appended after the patches (with its own position
embedding row), a LayerNorm precedes the layers, every layer's attention
rotates queries and keys by the patch's 2-D position (1-based column, then
row, each on half of the rotary pairs, pairs (2i, 2i + 1); the class token
unrotated) and the class token is dropped after the final LayerNorm. Its
projector (`PixelShuffleProjector`) stacks each square window of patches
into one token (space to depth: [v, u, d * window^2], the window's rows
outer), then fc1 -> GELU -> fc2 -> GELU (`adapter_dim` wide, the vision
adapter) and a projection to the decoder's width, all without biases; its
image tokens attend causally, as text does (no `image_blocks`).

`VisionConfig` (`ModelConfig.vision`) sizes both and says where the soft
tokens go: the decoder puts image i's u tokens at the positions of the
`image_token_id` placeholders, in order, and those tokens attend to each
other bidirectionally (`image_blocks`). `vision_layers = 0` is a text-only
model.

Parameters carry the decoder's logical axis names (embed, mlp, heads,
head_dim; "layers" when stacked), so one rule table shards both; a size a
rule does not divide stays replicated (`maxtext.sharding.rules`).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY` (v images, t patches, u
soft tokens of an image, h/w/e pixel rows/columns/channels, d the tower's
width).
"""

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
import numpy as np

from maxtext.common import axes
from maxtext.common import sections
from maxtext.layers import linear
from maxtext.layers import norm
from maxtext.layers import rope

ARCHS = ("siglip", "llama4")
# `VisionConfig.activation` -> the encoder MLP's activation.
ACTIVATIONS = {
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class VisionConfig:
  """A model's vision tower and where its tokens go (`ModelConfig.vision`).

  Attributes (their `model` section keys in `KEYS`):
    layers: Encoder layers; 0: no tower (a text-only model).
    embed_dim: Width d of the tower.
    mlp_dim: Hidden width of its MLPs.
    num_heads: Attention heads (d divides by them).
    patch_size: Side p of a square patch, in pixels.
    image_size: Side of the square image the tower takes, in pixels (a
      multiple of `patch_size`).
    norm_eps: Epsilon of its LayerNorms and of the projector's RMSNorm.
    activation: Of its MLPs, one of `ACTIVATIONS`.
    tokens_per_image: Soft tokens u of one image in the decoder (a square
      whose side divides image_size / patch_size).
    image_token_id: Placeholder id of one soft token in the decoder's input.
    image_start_id: Id the chat template puts before an image's
      placeholders (Gemma 3's <start_of_image>).
    image_end_id: Id it puts after them (<end_of_image>).
    arch: "siglip" (Gemma 3) or "llama4" (module docstring).
    adapter_dim: Width of Llama 4's vision adapter (0 otherwise).
    rope_theta: Base of Llama 4's 2-D rotary in the tower.
  """

  KEYS: ClassVar[dict[str, str]] = {
      "layers": "vision_layers", "embed_dim": "vision_embed_dim",
      "mlp_dim": "vision_mlp_dim", "num_heads": "vision_heads",
      "patch_size": "vision_patch_size", "image_size": "vision_image_size",
      "norm_eps": "vision_norm_eps", "activation": "vision_activation",
      "tokens_per_image": "mm_tokens_per_image",
      "image_token_id": "image_token_id", "image_start_id": "image_start_id",
      "image_end_id": "image_end_id", "arch": "vision_arch",
      "adapter_dim": "vision_adapter_dim", "rope_theta": "vision_rope_theta"}

  layers: int = 0
  embed_dim: int = 0
  mlp_dim: int = 0
  num_heads: int = 0
  patch_size: int = 14
  image_size: int = 896
  norm_eps: float = 1e-6
  activation: str = "gelu_tanh"
  tokens_per_image: int = 256
  image_token_id: int = 0
  image_start_id: int = 0
  image_end_id: int = 0
  arch: str = "siglip"
  adapter_dim: int = 0
  rope_theta: float = 10_000.0

  def __post_init__(self):
    def positive_int(field, minimum=1):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or (
          value < minimum):
        sections.fail_part(self, field, f"must be an integer >= {minimum}")

    positive_int("layers", 0)
    if not self.layers:
      return
    for field in ("embed_dim", "mlp_dim", "num_heads", "patch_size",
                  "image_size", "tokens_per_image"):
      positive_int(field)
    for field in ("image_token_id", "image_start_id", "image_end_id"):
      positive_int(field, 0)
    if self.embed_dim % self.num_heads:
      sections.fail_part(self, "num_heads",
                         f"must divide vision_embed_dim={self.embed_dim}")
    if self.image_size % self.patch_size:
      sections.fail_part(self, "image_size", "must be a multiple of "
                         f"vision_patch_size={self.patch_size}")
    side = math.isqrt(self.tokens_per_image)
    if side * side != self.tokens_per_image or self.patches_per_side % side:
      sections.fail_part(
          self, "tokens_per_image", "must be a square number whose root "
          f"divides the {self.patches_per_side} patches per side")
    if not self.norm_eps > 0:
      sections.fail_part(self, "norm_eps", "must be positive")
    if self.activation not in ACTIVATIONS:
      sections.fail_part(self, "activation",
                         f"valid values are {tuple(ACTIVATIONS)}")
    if self.arch not in ARCHS:
      sections.fail_part(self, "arch", f"valid values are {ARCHS}")
    if self.arch != "llama4":
      if self.adapter_dim:
        sections.fail_part(self, "adapter_dim", 'only vision_arch="llama4"'
                           " reads it; leave it at 0")
      return
    positive_int("adapter_dim")
    if self.head_dim % 4:
      sections.fail_part(self, "num_heads", "must leave a head width"
                         f" (vision_embed_dim / heads = {self.head_dim}) that"
                         " divides by 4 (the 2-D rotary)")
    shuffled = self.embed_dim * self.window**2
    if self.mlp_dim != shuffled:
      sections.fail_part(self, "mlp_dim", "must equal vision_embed_dim x"
                         f" window^2 = {shuffled} with vision_arch='llama4'"
                         " (the adapter reads the shuffled patches)")
    if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
      sections.fail_part(self, "rope_theta", "must be positive and finite")

  @property
  def patches_per_side(self) -> int:
    return self.image_size // self.patch_size

  @property
  def head_dim(self) -> int:
    return self.embed_dim // self.num_heads

  @property
  def window(self) -> int:
    """Side of the square of patches one soft token covers."""
    return self.patches_per_side // math.isqrt(self.tokens_per_image)

  @property
  def bidirectional_images(self) -> bool:
    """An image's soft tokens attend to each other (`image_blocks`)."""
    return self.arch == "siglip"


def patches(images_vhwe: jax.Array, patch_size: int) -> jax.Array:
  """Non-overlapping p x p patches, row by row: [v, t, p, p, e]."""
  count, height, width, channels = images_vhwe.shape
  rows, cols = height // patch_size, width // patch_size
  x = images_vhwe.reshape(count, rows, patch_size, cols, patch_size, channels)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(
      count, rows * cols, patch_size, patch_size, channels)


class EncoderLayer(nnx.Module):
  """Pre-norm encoder layer: bidirectional attention, then MLP."""

  def __init__(self, cfg: VisionConfig, *, dtype: str, param_dtype: str,
               rngs: nnx.Rngs):
    def project(in_shape, out_shape, in_axes, out_axes):
      return linear.Linear(in_shape, out_shape, in_axes=in_axes,
                           out_axes=out_axes, dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs, use_bias=True)

    def layer_norm():
      return norm.LayerNorm(cfg.embed_dim, axis_name=axes.EMBED,
                            eps=cfg.norm_eps, param_dtype=param_dtype)

    heads = (cfg.num_heads, cfg.head_dim)
    head_axes = (axes.HEADS, axes.HEAD_DIM)
    self.pre_attention_norm = layer_norm()
    self.query, self.key, self.value = (
        project((cfg.embed_dim,), heads, (axes.EMBED,), head_axes)
        for _ in range(3))
    self.output = project(heads, (cfg.embed_dim,), head_axes, (axes.EMBED,))
    self.pre_mlp_norm = layer_norm()
    self.fc1 = project((cfg.embed_dim,), (cfg.mlp_dim,), (axes.EMBED,),
                       (axes.MLP,))
    self.fc2 = project((cfg.mlp_dim,), (cfg.embed_dim,), (axes.MLP,),
                       (axes.EMBED,))
    self.activation = ACTIVATIONS[cfg.activation]
    self.scale = cfg.head_dim**-0.5

  def __call__(self, x_vtd: jax.Array,
               rotary: rope.Rotary | None = None) -> jax.Array:
    h_vtd = self.pre_attention_norm(x_vtd)
    q_vtHK, k_vtHK, v_vtHK = (self.query(h_vtd), self.key(h_vtd),
                              self.value(h_vtd))
    if rotary is not None:
      q_vtHK, k_vtHK = rotary.apply(q_vtHK), rotary.apply(k_vtHK)
    o_vtHK = jax.nn.dot_product_attention(q_vtHK, k_vtHK, v_vtHK,
                                          scale=self.scale)
    x_vtd = x_vtd + self.output(o_vtHK)
    h_vtF = self.activation(self.fc1(self.pre_mlp_norm(x_vtd)))
    return axes.constrain(x_vtd + self.fc2(h_vtF), _TOWER_AXES)


# The tower's stream: images split like batch rows.
_TOWER_AXES = (axes.BATCH, None, axes.EMBED)


def rotary_2d(cfg: VisionConfig) -> rope.Rotary:
  """Llama 4's rotary of the tower's tokens (module docstring): [1, t + 1,
  K / 2] angles, patch (row r, column c) by (c + 1) then (r + 1) times the
  K / 4 frequencies theta^(-4i / K); the class token (last) by 0."""
  quarter = cfg.head_dim // 4
  inv_freq = cfg.rope_theta**(-np.arange(quarter, dtype=np.float32) * 4 /
                              cfg.head_dim)
  side = cfg.patches_per_side
  index = np.arange(side * side)
  columns, rows = index % side + 1, index // side + 1
  angles = np.concatenate([columns[:, None] * inv_freq,
                           rows[:, None] * inv_freq], axis=-1)
  angles = np.concatenate([angles, np.zeros((1, 2 * quarter))])[None]
  return rope.Rotary(jnp.cos(jnp.asarray(angles, jnp.float32)),
                     jnp.sin(jnp.asarray(angles, jnp.float32)),
                     interleaved=True)


class VisionEncoder(nnx.Module):
  """SigLIP or Llama 4 vision encoder (module docstring): images
  [v, h, w, e] in [-1, 1] (`maxtext.data.images`) -> patch states
  [v, t, d]."""

  def __init__(self, cfg: VisionConfig, *, scan_layers: bool, dtype: str,
               param_dtype: str, rngs: nnx.Rngs, channels: int = 3):
    self.cfg = cfg
    self.scan_layers = scan_layers
    dtypes = dict(dtype=dtype, param_dtype=param_dtype)
    p = cfg.patch_size
    llama4 = cfg.arch == "llama4"
    self.patch_embedding = linear.Linear(
        (channels, p, p) if llama4 else (p, p, channels), (cfg.embed_dim,),
        in_axes=(None, None, None), out_axes=(axes.EMBED,),
        use_bias=not llama4, rngs=rngs, **dtypes)
    num_tokens = cfg.patches_per_side**2 + int(llama4)
    self.class_embedding = axes.param(
        nnx.initializers.normal(cfg.embed_dim**-0.5)(
            rngs.params(), (cfg.embed_dim,), jnp.dtype(param_dtype)),
        (axes.EMBED,)) if llama4 else None
    self.position_embedding = axes.param(
        nnx.initializers.normal(0.02)(rngs.params(),
                                      (num_tokens, cfg.embed_dim),
                                      jnp.dtype(param_dtype)),
        (None, axes.EMBED))
    self.pre_norm = norm.LayerNorm(
        cfg.embed_dim, axis_name=axes.EMBED, eps=cfg.norm_eps,
        param_dtype=param_dtype) if llama4 else None
    if scan_layers:
      @nnx.split_rngs(splits=cfg.layers)
      @nnx.vmap(axis_size=cfg.layers,
                transform_metadata={nnx.PARTITION_NAME: axes.LAYERS})
      def stacked(rngs: nnx.Rngs) -> EncoderLayer:
        return EncoderLayer(cfg, rngs=rngs, **dtypes)

      self.layers = stacked(rngs)
    else:
      self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs, **dtypes)
                              for _ in range(cfg.layers)])
    self.post_norm = norm.LayerNorm(cfg.embed_dim, axis_name=axes.EMBED,
                                    eps=cfg.norm_eps, param_dtype=param_dtype)
    self.dtype = jnp.dtype(dtype)

  def __call__(self, images_vhwe: jax.Array) -> jax.Array:
    size = self.cfg.image_size
    if images_vhwe.shape[1:3] != (size, size):
      raise ValueError(f"Images of {images_vhwe.shape[1]}x"
                       f"{images_vhwe.shape[2]} pixels; the vision tower "
                       f"takes {size}x{size} (vision_image_size).")
    x_vtppe = patches(images_vhwe.astype(self.dtype), self.cfg.patch_size)
    rotary = None
    if self.class_embedding is not None:  # Llama 4.
      x_vtd = self.patch_embedding(x_vtppe.transpose(0, 1, 4, 2, 3))
      x_vtd = jnp.concatenate([x_vtd, jnp.broadcast_to(
          self.class_embedding[...].astype(self.dtype),
          (x_vtd.shape[0], 1, x_vtd.shape[2]))], axis=1)
      rotary = rotary_2d(self.cfg)
    else:
      x_vtd = self.patch_embedding(x_vtppe)
    x_vtd = x_vtd + self.position_embedding[...].astype(self.dtype)
    if self.pre_norm is not None:
      x_vtd = self.pre_norm(x_vtd)
    x_vtd = axes.constrain(x_vtd, _TOWER_AXES)
    if self.scan_layers:
      graphdef, state = nnx.split(self.layers)

      def body(x_vtd, layer_state):
        return nnx.merge(graphdef, layer_state)(x_vtd, rotary), None

      x_vtd, _ = jax.lax.scan(body, x_vtd, state)
    else:
      for layer in self.layers:
        x_vtd = layer(x_vtd, rotary)
    x_vtd = self.post_norm(x_vtd)
    if self.class_embedding is not None:
      x_vtd = x_vtd[:, :-1]
    return x_vtd


class PoolingProjector(nnx.Module):
  """Patch states [v, t, d] -> soft tokens [v, u, D] (module docstring)."""

  def __init__(self, cfg: VisionConfig, *, embed_dim: int, dtype: str,
               param_dtype: str, rngs: nnx.Rngs):
    self.cfg = cfg
    self.norm = norm.RMSNorm(cfg.embed_dim, axis_name=axes.EMBED,
                             eps=cfg.norm_eps, offset=1.0,
                             param_dtype=param_dtype)
    self.projection = linear.Linear(
        (cfg.embed_dim,), (embed_dim,), in_axes=(None,),
        out_axes=(axes.EMBED,), dtype=dtype, param_dtype=param_dtype,
        rngs=rngs)

  def __call__(self, x_vtd: jax.Array) -> jax.Array:
    count, _, width = x_vtd.shape
    tokens_side = math.isqrt(self.cfg.tokens_per_image)
    window = self.cfg.window
    x = x_vtd.reshape(count, tokens_side, window, tokens_side, window, width)
    pooled_vud = jnp.mean(x.astype(jnp.float32), axis=(2, 4)).reshape(
        count, tokens_side**2, width).astype(x_vtd.dtype)
    return self.projection(self.norm(pooled_vud))


class PixelShuffleProjector(nnx.Module):
  """Llama 4's: patch states [v, t, d] -> soft tokens [v, u, D] (module
  docstring)."""

  def __init__(self, cfg: VisionConfig, *, embed_dim: int, dtype: str,
               param_dtype: str, rngs: nnx.Rngs):
    def project(in_dim, out_dim, in_axis, out_axis):
      return linear.Linear((in_dim,), (out_dim,), in_axes=(in_axis,),
                           out_axes=(out_axis,), dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs)

    self.cfg = cfg
    self.fc1 = project(cfg.mlp_dim, cfg.adapter_dim, axes.MLP, None)
    self.fc2 = project(cfg.adapter_dim, cfg.adapter_dim, None, None)
    self.projection = project(cfg.adapter_dim, embed_dim, None, axes.EMBED)

  def __call__(self, x_vtd: jax.Array) -> jax.Array:
    count, _, width = x_vtd.shape
    side, window = self.cfg.patches_per_side, self.cfg.window
    tokens = side // window
    x = x_vtd.reshape(count, tokens, window, tokens, window, width)
    x_vuF = x.transpose(0, 1, 3, 2, 4, 5).reshape(
        count, tokens * tokens, window * window * width)
    gelu = ACTIVATIONS["gelu"]
    return self.projection(gelu(self.fc2(gelu(self.fc1(x_vuF)))))


def image_blocks(is_image_BL: jax.Array) -> jax.Array:
  """Ids [B, L] of each run of consecutive image tokens (0, 1, ... along a
  row), -1 for other tokens: a token attends to every token of its run, as
  transformers' `token_type_ids` make it."""
  previous_BL = jnp.pad(is_image_BL, ((0, 0), (1, 0)))[:, :-1]
  starts_BL = is_image_BL & ~previous_BL
  ids_BL = jnp.cumsum(starts_BL.astype(jnp.int32), axis=1) - 1
  return jnp.where(is_image_BL, ids_BL, -1)


def place_soft_tokens(x_BLD: jax.Array, is_image_BL: jax.Array,
                      soft_BND: jax.Array) -> jax.Array:
  """`x_BLD` with row b's image tokens replaced, in order, by its soft
  tokens `soft_BND` (N = its images' tokens, images in order); a row's
  placeholders past N keep their embedding."""
  index_BL = jnp.cumsum(is_image_BL.astype(jnp.int32), axis=1) - 1
  count = soft_BND.shape[1]
  gathered_BLD = jnp.take_along_axis(
      soft_BND, jnp.clip(index_BL, 0, count - 1)[..., None], axis=1)
  keep_BL = is_image_BL & (index_BL < count)
  return jnp.where(keep_BL[..., None], gathered_BLD.astype(x_BLD.dtype),
                   x_BLD)
