"""Rotary position embeddings (half-split layout, as in Hugging Face).

Frequency scalings: "default" (none), "linear" (positions divided by a
factor) and "llama3" (long wavelengths divided by a factor, short ones kept,
a smooth blend in between). Local (sliding window) layers use plain rotary
embeddings with their own base; global layers use the configured scaling.

Shape key: B batch, L length, H heads, K head dim, k = K // 2.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common.model_config import ModelConfig


def inverse_frequencies(
    head_dim: int,
    theta: float,
    scaling: str = "default",
    factor: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_length: int = 8192,
) -> np.ndarray:
  """Per-pair rotation frequencies [K // 2] (float64 numpy)."""
  inv_freq = theta**(-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  if scaling == "default":
    return inv_freq
  if scaling == "linear":
    return inv_freq / factor
  if scaling == "llama3":
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original_max_length / low_freq_factor
    high_freq_wavelength = original_max_length / high_freq_factor
    smooth = (original_max_length / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return np.where(
        wavelength > low_freq_wavelength, inv_freq / factor,
        np.where(wavelength < high_freq_wavelength, inv_freq, blended))
  raise ValueError(f"Unknown rope scaling {scaling!r}; valid: "
                   "'default', 'linear', 'llama3'.")


@dataclasses.dataclass(frozen=True)
class Rotary:
  """Cosines and sines [B, L, K // 2] of the rotation at each position."""

  cos_BLk: jax.Array
  sin_BLk: jax.Array

  @classmethod
  def at(cls, positions_BL: jax.Array, inv_freq: np.ndarray) -> "Rotary":
    angles_BLk = positions_BL[..., None].astype(jnp.float32) * jnp.asarray(
        inv_freq, jnp.float32)
    return cls(jnp.cos(angles_BLk), jnp.sin(angles_BLk))

  def apply(self, x_BLHK: jax.Array) -> jax.Array:
    """Rotates pairs (x[k], x[k + K/2]) by the position's angles."""
    x1, x2 = jnp.split(x_BLHK.astype(jnp.float32), 2, axis=-1)
    cos = self.cos_BLk[:, :, None, :]
    sin = self.sin_BLk[:, :, None, :]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                              axis=-1)
    return rotated.astype(x_BLHK.dtype)


def global_inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Frequencies of global layers: base `rope_theta` with the scaling."""
  return inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                             cfg.rope_scaling_factor, cfg.rope_low_freq_factor,
                             cfg.rope_high_freq_factor,
                             cfg.rope_original_max_length)


def local_inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Frequencies of local (sliding window) layers: base `rope_local_theta`."""
  return inverse_frequencies(cfg.head_dim, cfg.rope_local_theta)
