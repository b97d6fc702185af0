"""A table of how every parameter of a model is laid out on a mesh.

`parameter_table(model_config, mesh_shape, param_rules)` lists, for each
parameter: its path, shape, logical axis names, the mesh `PartitionSpec` the
rules give it, and the bytes one device holds. It needs no devices (the mesh
is given by its axis sizes) and allocates nothing, so it can describe a pod
layout from a laptop. `tools/sharding/print_sharding.py` prints it; golden
tables per family are compared in `tools/sharding/print_sharding_test.py`.
"""

from collections.abc import Mapping
import math

from flax import nnx
import jax
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.models import registry
from maxtext.sharding import rules as rules_lib


def _shard_shape(shape, spec, mesh_shape):
  dims = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * len(shape)):
    names = () if entry is None else (
        (entry,) if isinstance(entry, str) else entry)
    dims.append(dim // math.prod(mesh_shape[n] for n in names))
  return tuple(dims)


def parameter_table(model_config: ModelConfig, mesh_shape: Mapping[str, int],
                    param_rules: rules_lib.Rules) -> str:
  """The layout of every parameter, one line each, plus totals."""
  model = nnx.eval_shape(
      lambda: registry.create_model(model_config, rngs=nnx.Rngs(0)))
  _, params, _ = nnx.split(model, nnx.Param, ...)
  names = rules_lib.logical_names(params)
  shapes = nnx.to_pure_dict(params)
  rows = []
  total = per_device = 0
  flat_names = jax.tree_util.tree_leaves_with_path(
      names, is_leaf=lambda x: isinstance(x, tuple))
  for (path, logical), leaf in zip(flat_names, jax.tree.leaves(shapes)):
    if len(logical) != len(leaf.shape):
      logical = (None,) * len(leaf.shape)
    spec = rules_lib.logical_to_mesh(logical, leaf.shape, param_rules,
                                     dict(mesh_shape))
    itemsize = np.dtype(leaf.dtype).itemsize
    shard_bytes = math.prod(_shard_shape(leaf.shape, spec,
                                         mesh_shape)) * itemsize
    total += math.prod(leaf.shape) * itemsize
    per_device += shard_bytes
    key = "/".join(str(getattr(k, "key", k)) for k in path)
    rows.append((key, str(tuple(leaf.shape)), str(tuple(logical)),
                 str(spec), str(shard_bytes)))
  header = ("parameter", "shape", "logical axes", "partition spec",
            "bytes per device")
  widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
  mesh_text = " ".join(f"{k}={v}" for k, v in mesh_shape.items())
  lines = [f"# {model_config.family}: mesh {mesh_text}",
           "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
  lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in rows]
  lines.append(f"# total bytes {total}; per device {per_device}")
  return "\n".join(lines) + "\n"
