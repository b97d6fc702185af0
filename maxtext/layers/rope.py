"""Rotary position embeddings: the half-split layout (Hugging Face's Llama:
dimension k pairs with k + K/2) or the interleaved one (Llama 4: 2i with
2i + 1).

Frequency scalings: "default" (none), "linear" (positions divided by a
factor), "llama3" (long wavelengths divided by a factor, short ones kept,
a smooth blend in between) and "yarn" (the same idea with the blend set by
rotation counts `beta_fast`/`beta_slow`, plus an attention factor that
multiplies the cosines and sines; DeepSeek-V3, GPT-OSS). Local (sliding window) layers use plain rotary
embeddings with their own base; global layers use the configured scaling,
or none at all (`global_nope`: Llama 4's NoPE layers), or on a fraction of
their dimensions only (`global_fraction`: Gemma 4's "proportional" rotary,
whose frequencies are those of the whole head, the pairs past the fraction
not rotating), or on their first dimensions as a narrower head of its own
(`partial_factor`: Qwen3-Next's and Qwen3.5's partial rotary).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common import sections


def inverse_frequencies(
    head_dim: int,
    theta: float,
    scaling: str = "default",
    factor: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_length: int = 8192,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> np.ndarray:
  """Per-pair rotation frequencies [K // 2] (float64 numpy).

  `factor` and `original_max_length` serve "linear", "llama3" and "yarn";
  `low_freq_factor`/`high_freq_factor` "llama3"; `beta_fast`, `beta_slow`
  (rotations over `original_max_length` bounding the blend) and `truncate`
  (round the blend's bounds outwards to whole dimensions) "yarn".
  """
  inv_freq = theta**(-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  if scaling == "default":
    return inv_freq
  if scaling == "linear":
    return inv_freq / factor
  if scaling == "llama3":
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original_max_length / low_freq_factor
    high_freq_wavelength = original_max_length / high_freq_factor
    # Equal factors (Llama 4) leave no band to blend.
    gap = max(high_freq_factor - low_freq_factor, 1e-30)
    smooth = (original_max_length / wavelength - low_freq_factor) / gap
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return np.where(
        wavelength > low_freq_wavelength, inv_freq / factor,
        np.where(wavelength < high_freq_wavelength, inv_freq, blended))
  if scaling == "yarn":
    def dimension(rotations):  # Dimension with this many full rotations.
      return head_dim * math.log(original_max_length /
                                 (rotations * 2 * math.pi)) / (
                                     2 * math.log(theta))

    low, high = dimension(beta_fast), dimension(beta_slow)
    if truncate:
      low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
      high += 0.001
    ramp = np.clip((np.arange(head_dim // 2) - low) / (high - low), 0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)
  raise ValueError(f"Unknown rope scaling {scaling!r}; valid: {SCALINGS}.")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
  """YaRN's magnitude correction `0.1 * mscale * ln(factor) + 1` (1 when
  factor <= 1)."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(scaling: str, factor: float, mscale: float = 0.0,
                     mscale_all_dim: float = 0.0) -> float:
  """Multiplier of the cosines and sines: 1 except for "yarn", where it is
  `yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)` when
  both are set (DeepSeek-V3) and `yarn_mscale(factor)` otherwise."""
  if scaling != "yarn":
    return 1.0
  if mscale and mscale_all_dim:
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
  return yarn_mscale(factor)


@dataclasses.dataclass(frozen=True)
class Rotary:
  """Cosines and sines [B, L, R // 2] of the rotation at each position,
  times a constant `scale` (YaRN's attention factor; 1 otherwise); with
  `interleaved`, pair k rotates dimensions (2k, 2k + 1), else (k, k + R/2).
  R is the head dim K, or less: then the first R dimensions of each head
  rotate and the rest pass unchanged (`RopeConfig.partial_factor`)."""

  cos_BLk: jax.Array
  sin_BLk: jax.Array
  interleaved: bool = False

  @classmethod
  def at(cls, positions_BL: jax.Array, inv_freq: np.ndarray,
         scale: float = 1.0, interleaved: bool = False) -> "Rotary":
    angles_BLk = positions_BL[..., None].astype(jnp.float32) * jnp.asarray(
        inv_freq, jnp.float32)
    return cls(jnp.cos(angles_BLk) * scale, jnp.sin(angles_BLk) * scale,
               interleaved)

  def apply(self, x_BLHK: jax.Array) -> jax.Array:
    """Rotates each pair of dimensions by the position's angle."""
    rotated_dim = 2 * self.cos_BLk.shape[-1]
    if rotated_dim < x_BLHK.shape[-1]:
      return jnp.concatenate([self.apply(x_BLHK[..., :rotated_dim]),
                              x_BLHK[..., rotated_dim:]], axis=-1)
    x = x_BLHK.astype(jnp.float32)
    cos = self.cos_BLk[:, :, None, :]
    sin = self.sin_BLk[:, :, None, :]
    if self.interleaved:
      x1, x2 = x[..., 0::2], x[..., 1::2]
      rotated = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                          axis=-1).reshape(x.shape)
    else:
      x1, x2 = jnp.split(x, 2, axis=-1)
      rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                                axis=-1)
    return rotated.astype(x_BLHK.dtype)


SCALINGS = ("default", "linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeConfig:
  """A model's rotary embeddings (`ModelConfig.rope`).

  Attributes (their `model` section keys in `KEYS`):
    theta: Rotary base of global layers.
    local_theta: Rotary base of local (sliding window) layers; None: local
      layers use the global layers' rotary (base and scaling; GPT-OSS).
    scaling: Frequency scaling of global layers (`SCALINGS`, module doc).
    scaling_factor: Factor of the "linear", "llama3" and "yarn" scalings.
    low_freq_factor, high_freq_factor: "llama3" scaling's factors.
    original_max_length: "llama3" and "yarn": pre-training context length.
    yarn_beta_fast, yarn_beta_slow: "yarn": rotations bounding the blend.
    yarn_truncate: "yarn": round the blend's bounds to whole dimensions.
    yarn_mscale, yarn_mscale_all_dim: "yarn": the attention factor's
      numerator and denominator mscale (0: unset; `attention_factor`).
    interleaved: Rotate dimension pairs (2i, 2i + 1) instead of (i, i + K/2)
      (Llama 4's complex rotary).
    global_nope: Global layers have no rotary at all (Llama 4's NoPE
      layers); local ones keep theirs.
    global_fraction: Global layers rotate only their first
      floor(fraction * K / 2) pairs, at the frequencies of a K-wide head;
      the other pairs keep frequency 0 (Gemma 4's "proportional" rotary
      with its partial_rotary_factor); 1.0: every pair.
    partial_factor: Only the first partial_factor * K dimensions of each
      head rotate, as a head of that width (its own frequencies, pairs
      (k, k + R/2)); the rest pass unrotated (Qwen3-Next's and Qwen3.5's
      partial_rotary_factor); 1.0: the whole head.
  """

  KEYS: ClassVar[dict[str, str]] = {
      "theta": "rope_theta", "local_theta": "rope_local_theta",
      "scaling": "rope_scaling", "scaling_factor": "rope_scaling_factor",
      "low_freq_factor": "rope_low_freq_factor",
      "high_freq_factor": "rope_high_freq_factor",
      "original_max_length": "rope_original_max_length",
      "yarn_beta_fast": "rope_yarn_beta_fast",
      "yarn_beta_slow": "rope_yarn_beta_slow",
      "yarn_truncate": "rope_yarn_truncate",
      "yarn_mscale": "rope_yarn_mscale",
      "yarn_mscale_all_dim": "rope_yarn_mscale_all_dim",
      "interleaved": "rope_interleaved", "global_nope": "rope_global_nope",
      "global_fraction": "rope_global_fraction",
      "partial_factor": "rope_partial_factor",
  }

  theta: float = 10_000.0
  local_theta: float | None = 10_000.0
  scaling: str = "default"
  scaling_factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_length: int = 8192
  yarn_beta_fast: float = 32.0
  yarn_beta_slow: float = 1.0
  yarn_truncate: bool = True
  yarn_mscale: float = 0.0
  yarn_mscale_all_dim: float = 0.0
  interleaved: bool = False
  global_nope: bool = False
  global_fraction: float = 1.0
  partial_factor: float = 1.0

  def __post_init__(self):
    def fail(field, valid):
      sections.fail_part(self, field, valid)

    if self.scaling not in SCALINGS:
      fail("scaling", f"valid values are {SCALINGS}")
    for name in ("yarn_truncate", "interleaved", "global_nope"):
      if not isinstance(getattr(self, name), bool):
        fail(name, "must be True or False")
    if self.theta <= 0:
      fail("theta", "must be positive")
    if self.local_theta is not None and self.local_theta <= 0:
      fail("local_theta",
           "must be positive, or None (the global layers' rotary)")
    if self.scaling == "default" and self.scaling_factor != 1.0:
      fail("scaling_factor", 'must be 1.0 when rope_scaling="default"')
    if self.scaling != "default" and self.scaling_factor < 1.0:
      fail("scaling_factor",
           f"must be >= 1.0 for rope_scaling={self.scaling!r}")
    if self.scaling == "llama3" and not (
        0 < self.low_freq_factor <= self.high_freq_factor):
      fail("high_freq_factor", "llama3 scaling needs 0 < rope_low_freq_factor"
           f" ({self.low_freq_factor}) <= rope_high_freq_factor")
    # Equal bounds are allowed (Kimi K2: both 1).
    if self.scaling == "yarn" and not (
        0 < self.yarn_beta_slow <= self.yarn_beta_fast):
      fail("yarn_beta_fast", "yarn scaling needs 0 < rope_yarn_beta_slow"
           f" ({self.yarn_beta_slow}) <= rope_yarn_beta_fast")
    if self.original_max_length < 1:
      fail("original_max_length", "must be a positive integer")
    if not 0 < self.global_fraction <= 1:
      fail("global_fraction", "must be in (0, 1] (1.0: every dimension "
           "rotates)")
    if not 0 < self.partial_factor <= 1:
      fail("partial_factor", "must be in (0, 1] (1.0: the whole head "
           "rotates)")

  def rotated_dim(self, head_dim: int) -> int:
    """How many of a head's `head_dim` dimensions rotate."""
    return int(self.partial_factor * head_dim)

  def global_inverse_frequencies(self, head_dim: int) -> np.ndarray:
    """Frequencies of global layers: base `theta` with the scaling, 0
    past `global_fraction` of the pairs."""
    head_dim = self.rotated_dim(head_dim)
    inv_freq = inverse_frequencies(
        head_dim, self.theta, self.scaling, self.scaling_factor,
        self.low_freq_factor, self.high_freq_factor, self.original_max_length,
        self.yarn_beta_fast, self.yarn_beta_slow, self.yarn_truncate)
    rotated = int(self.global_fraction * head_dim // 2)
    return np.where(np.arange(head_dim // 2) < rotated, inv_freq, 0.0)

  def global_attention_factor(self) -> float:
    """`Rotary` scale of global layers (YaRN's attention factor, else 1)."""
    return attention_factor(self.scaling, self.scaling_factor,
                            self.yarn_mscale, self.yarn_mscale_all_dim)

  def local_inverse_frequencies(self, head_dim: int) -> np.ndarray:
    """Frequencies of local (sliding window) layers: base `local_theta`."""
    return inverse_frequencies(self.rotated_dim(head_dim), self.local_theta)

  def global_rotary(self, positions_BL: jax.Array,
                    head_dim: int) -> "Rotary":
    """The rotary of a global layer with heads of `head_dim`."""
    return Rotary.at(positions_BL, self.global_inverse_frequencies(head_dim),
                     self.global_attention_factor(), self.interleaved)

  def local_rotary(self, positions_BL: jax.Array, head_dim: int) -> "Rotary":
    """The rotary of a local layer (`local_theta`, which is set)."""
    return Rotary.at(positions_BL, self.local_inverse_frequencies(head_dim),
                     interleaved=self.interleaved)
