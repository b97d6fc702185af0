"""The platform a computation is built for, whether cuDNN is there, and
running Pallas kernels per shard of the activation sharding's mesh.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Callable
import functools

import jax
from jax.sharding import PartitionSpec as P

from maxtext.common import axes


def target_platform() -> str:
  """"cpu", "gpu" or "tpu": the platform of the mesh of the activation
  sharding in effect (`axes.activation_sharding`, so compiling ahead of time
  for TPU on a CPU host picks TPU kernels), else `jax.default_backend()`."""
  mesh = _mesh()
  if mesh is not None:
    return mesh.devices.flat[0].platform
  return jax.default_backend()


@functools.cache
def cudnn_available() -> bool:
  """Whether cuDNN's library loads: JAX's cuDNN attention needs it even to
  compile for a GPU (a compile-only GPU target without the nvidia-cudnn
  package has none)."""
  # pylint: disable-next=import-outside-toplevel
  from jax._src.cudnn import fused_attention_stablehlo
  try:
    fused_attention_stablehlo.check_cudnn_version()
  except RuntimeError:
    return False
  return True


def _mesh() -> jax.sharding.Mesh | None:
  """The mesh of the activation sharding in effect, if any."""
  return getattr(axes.current_constrainer(), "mesh", None)


def single_device() -> bool:
  """Whether the computation runs on one device (no activation mesh, or a
  one-device mesh): a Pallas kernel then needs no partitioning."""
  mesh = _mesh()
  return mesh is None or mesh.size == 1


def per_shard_attention(
    fn: Callable[..., jax.Array],
    q_BLHK: jax.Array,
    k_BSGK: jax.Array,
    v_BSGK: jax.Array,
    segment_ids_BL: jax.Array | None,
    sinks_H: jax.Array | None,
) -> jax.Array:
  """`fn(q, k, v, segment_ids_BL, sinks_H)` on each device's shard.

  Pallas (Mosaic) kernels cannot be partitioned by XLA: under an activation
  sharding whose mesh has more than one device, the call runs in a
  `jax.shard_map` split as the compute rules split the batch and the heads
  (the lengths and the head dim must be whole). Otherwise `fn` runs as is.

  Raises:
    ValueError: the compute rules split a length or the head dim, or split
      the query heads and the key/value heads differently.
  """
  if single_device():
    return fn(q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, sinks_H)
  constrainer = axes.current_constrainer()
  mesh = constrainer.mesh
  q_spec = constrainer.compute_spec(
      (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM), q_BLHK.shape)
  kv_spec = constrainer.compute_spec(
      (axes.BATCH, axes.KV_LENGTH, axes.KV_HEADS, axes.HEAD_DIM),
      k_BSGK.shape)
  if (q_spec[1] is not None or kv_spec[1] is not None or
      q_spec[3] is not None or q_spec[0] != kv_spec[0] or
      q_spec[2] != kv_spec[2]):
    raise ValueError(
        f"A Pallas attention kernel runs per shard of batch and heads; the "
        f"compute rules give queries {q_spec} and keys {kv_spec} (lengths "
        "and head dim must be unsplit, batch and heads split alike). Use "
        "attention_kernel.impl 'blockwise' or 'reference' with these rules.")
  row_spec = P(q_spec[0], None)
  return jax.shard_map(
      fn, mesh=mesh,
      in_specs=(q_spec, kv_spec, kv_spec,
                None if segment_ids_BL is None else row_spec,
                None if sinks_H is None else P(q_spec[2])),
      out_specs=q_spec, check_vma=False)(q_BLHK, k_BSGK, v_BSGK,
                                         segment_ids_BL, sinks_H)
