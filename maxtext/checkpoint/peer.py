"""The peer tier: local checkpoints on each process's own storage, restored
from another replica when a process lost its copy.

With several processes and a mesh whose `data` axis spans them, each replica
of the training state (the devices at one index of `data`: FSDP, tensor and
the other axes inside) lives on its own processes. `PeerCheckpointer` saves
each process's shards to `<local_dir>/process_<i>/<step>/` on that process's
own disk (a RAM disk or local SSD; `local_dir` may be a link that resolves to
each machine's own folder), with a manifest of its own files
(`maxtext.checkpoint.integrity`). A step is available when the processes of
at least one replica all hold it intact; to restore it, that replica reads
its files and sends the state to the other replicas over the devices (one
exact copy, bit for bit), so that a restarted process whose local folder is
gone (a machine replaced) resumes from its peer's copy instead of the
persistent tier.

Why not Orbax's `emergency.CheckpointManager`, whose broadcast this follows:
it owns the persistent tier too, checkpoints one `state` item only (the data
pipeline position is a second item here), and has no manifest check or
fallback to an older step. The local saves use Orbax's own per-process
array handler, as its emergency manager does.

`check_mesh` refuses, in one line naming the mesh, a run where some process
holds no full replica of the state apart from others (pure FSDP across
processes, one data replica, ZeRO-1's optimizer state split over `data`).
"""

from collections.abc import Sequence
import json
import os
import time
from typing import Any

from absl import logging
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import type_handlers

from maxtext.checkpoint import integrity
from maxtext.checkpoint import manager

REPLICA_AXIS = "data"
PROCESS_DIR_PREFIX = "process_"


def replica_processes(mesh: jax.sharding.Mesh) -> list[frozenset[int]]:
  """The processes that hold each replica (index along `REPLICA_AXIS`)."""
  axis = mesh.axis_names.index(REPLICA_AXIS)
  return [frozenset(d.process_index for d in
                    np.take(mesh.devices, r, axis=axis).flat)
          for r in range(mesh.devices.shape[axis])]


def check_mesh(mesh: jax.sharding.Mesh, *, zero1: bool) -> None:
  """Refuses a mesh on which losing one process's local files would lose
  every replica of the state.

  Raises:
    ValueError: one line naming the mesh and what would enable the tier.
  """
  processes = jax.process_count()
  shape = dict(mesh.shape)
  if processes == 1:
    raise ValueError(
        "checkpoint.local_peers=True restores a process's local checkpoints"
        " from another process, but this run has one process; set it to"
        " False.")
  groups = replica_processes(mesh)
  alone = [p for p in range(processes)
           if all(p in group for group in groups)]
  if alone:
    per_process = mesh.devices.size // processes
    raise ValueError(
        f"checkpoint.local_peers=True needs a replica of the state held by"
        f" other processes than each process, but on the mesh {shape} over"
        f" {processes} processes process {alone[0]} holds part of every"
        f" {REPLICA_AXIS} replica; make the {REPLICA_AXIS} axis span the"
        f" processes (e.g. mesh.ici.data={processes}, mesh.ici.fsdp="
        f"{per_process}), or set checkpoint.local_peers=False.")
  if zero1:
    raise ValueError(
        "checkpoint.local_peers=True needs a full replica of the state on"
        f" each {REPLICA_AXIS} index, but sharding.zero1=True splits the"
        f" optimizer state over {REPLICA_AXIS}; turn one of them off.")


def _gather_lists(values: Sequence[int]) -> list[list[int]]:
  """Every process's `values` (one all-gather of the lengths, one of the
  padded values)."""
  lengths = multihost_utils.process_allgather(np.asarray([len(values)]))
  width = max(1, int(np.max(lengths)))
  padded = np.full((width,), -1, np.int64)
  padded[:len(values)] = values
  rows = multihost_utils.process_allgather(padded).reshape(-1, width)
  return [[int(v) for v in row[:int(n)]]
          for row, n in zip(rows, np.ravel(lengths))]


def _broadcast_json(value: Any, source: int) -> Any:
  """Process `source`'s JSON-able `value`, on every process."""
  data = json.dumps(value).encode() if jax.process_index() == source else b""
  lengths = multihost_utils.process_allgather(np.asarray([len(data)]))
  width = max(1, int(np.max(lengths)))
  padded = np.zeros((width,), np.uint8)
  padded[:len(data)] = np.frombuffer(data, np.uint8)
  rows = multihost_utils.process_allgather(padded).reshape(-1, width)
  return json.loads(rows[source][:int(np.ravel(lengths)[source])].tobytes())


def _encode(node: Any) -> Any:
  """Orbax's metadata tree as JSON: dicts, lists and (shape, dtype)."""
  if isinstance(node, dict):
    return {"dict": {str(k): _encode(v) for k, v in node.items()}}
  if isinstance(node, (list, tuple)):
    return {"list": [_encode(v) for v in node]}
  if node is None:
    return {"none": True}
  return {"array": [list(node.shape), np.dtype(node.dtype).name]}


def _decode(node: dict[str, Any]) -> Any:
  if "dict" in node:
    return {k: _decode(v) for k, v in node["dict"].items()}
  if "list" in node:
    return [_decode(v) for v in node["list"]]
  if "none" in node:
    return None
  shape, dtype = node["array"]
  return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def _as_bits(x: jax.Array) -> jax.Array:
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint8)
  return jax.lax.bitcast_convert_type(
      x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))


def _from_bits(bits: jax.Array, dtype) -> jax.Array:
  if dtype == jnp.bool_:
    return bits.astype(jnp.bool_)
  return jax.lax.bitcast_convert_type(bits, dtype)


def _merge(stacked: tuple[jax.Array, ...], dtypes: tuple[Any, ...]
           ) -> tuple[jax.Array, ...]:
  # One replica holds the values, the others zeros: summing the bits over
  # the replica axis copies them exactly (a float sum would turn -0.0 into
  # 0.0).
  return tuple(_from_bits(jnp.sum(_as_bits(x), axis=0, dtype=_as_bits(x).dtype),
                          dtype) for x, dtype in zip(stacked, dtypes))


class PeerCheckpointer(manager.Checkpointer):
  """The local tier of one process (see the module docstring).

  Every method is called by every process at the same point of the run;
  `all_steps`, `check`, `restore` and `quarantine` exchange what each holds.
  """

  def __init__(self, local_dir: str, mesh: jax.sharding.Mesh, *,
               max_to_keep: int, async_save: bool):
    self._mesh = mesh
    self._groups = replica_processes(mesh)
    self._sources: dict[int, int] = {}  # step -> replica restoring it.
    directory = os.path.join(local_dir,
                             f"{PROCESS_DIR_PREFIX}{jax.process_index()}")
    os.makedirs(directory, exist_ok=True)
    super().__init__(directory, max_to_keep=max_to_keep,
                     async_save=async_save, tier="local")

  def _cleans_up(self) -> bool:
    return True  # Each process its own folder.

  def _orbax_manager(self, max_to_keep: int) -> ocp.CheckpointManager:
    # This process alone writes (and waits for) its own folder; its arrays
    # are its devices' shards, whichever replica each shard counts as.
    process = jax.process_index()
    multiprocessing = ocp.options.MultiprocessingOptions(
        primary_host=None, active_processes={process},
        barrier_sync_key_prefix=f"local-{process}")
    registry = type_handlers.create_type_handler_registry((
        jax.Array, type_handlers.ArrayHandler(
            primary_host=None, replica_id=None, use_replica_parallel=False)))
    return manager.orbax_manager(
        self.directory, max_to_keep=max_to_keep,
        on_commit=self._write_manifest, multiprocessing=multiprocessing,
        state_handler=ocp.PyTreeCheckpointHandler(
            use_ocdbt=True, use_zarr3=True,
            multiprocessing_options=multiprocessing,
            type_handler_registry=registry),
        create=False, directories_in_background=False)

  def _state_save_args(self, state: Any) -> ocp.args.CheckpointArgs:
    return ocp.args.PyTreeSave(state)

  def _saved_state(self, step: int) -> Any:
    saved = super()._saved_state(step)
    return getattr(saved, "tree", saved)  # The PyTree handler's wrapper.

  def _replicas_with(self, held: list[list[int]], step: int) -> list[int]:
    return [r for r, group in enumerate(self._groups)
            if all(step in held[p] for p in group)]

  def all_steps(self) -> list[int]:
    """Steps that all processes of some replica hold, ascending."""
    held = _gather_lists(sorted(self._manager.all_steps()))
    return sorted(step for step in set().union(*map(set, held))
                  if self._replicas_with(held, step))

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def check(self, step: int) -> list[str]:
    """[] when some replica holds `step` intact on all its processes (it
    will restore it), else this process's problems with it."""
    own = (integrity.check(self.step_path(step))
           if step in self._manager.all_steps() else ["missing"])
    intact = multihost_utils.process_allgather(np.asarray(not own)).ravel()
    usable = [r for r, group in enumerate(self._groups)
              if all(intact[p] for p in group)]
    if usable:
      self._sources[step] = usable[0]
      return []
    return own or ["no replica holds it intact on all its processes (see"
                   " the other processes' logs)"]

  def restore(self, abstract_state: Any, step: int | None = None, *,
              migrate: manager.Migration | None = None
              ) -> tuple[Any, dict[str, Any]]:
    """Restores `step` (checked by `check` first) from the replica that
    holds it and copies it to the others; see `Checkpointer.restore`."""
    if step is None or step not in self._sources:
      raise manager.CheckpointError(
          f"Step {step} of the local tier was not checked; call check()"
          " first.")
    replica = self._sources[step]
    source = min(self._groups[replica])
    is_source = jax.process_index() in self._groups[replica]
    if not is_source:
      logging.warning(
          "Restoring step %d of the local tier from its copy on processes"
          " %s (replica %d of the %s axis).", step,
          sorted(self._groups[replica]), replica, REPLICA_AXIS)
    reply = {}
    if is_source:
      try:
        reply["saved"] = _encode(self._saved_state(step))
      except manager.CheckpointError as e:
        reply["error"] = str(e)
    reply = _broadcast_json(reply, source)
    if "error" in reply:
      raise manager.CheckpointError(reply["error"])
    saved = _decode(reply["saved"])
    target, convert = (migrate(saved, abstract_state) if migrate else
                       (abstract_state, None))
    self._check_fits(step, saved, target)
    leaves, treedef = jax.tree.flatten(target)
    sub_mesh = jax.sharding.Mesh(
        np.take(self._mesh.devices, [replica],
                axis=self._mesh.axis_names.index(REPLICA_AXIS)),
        self._mesh.axis_names)
    reply, restored = {}, None
    if is_source:
      on_replica = jax.tree.unflatten(treedef, [
          jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding
                               .NamedSharding(sub_mesh, x.sharding.spec))
          for x in leaves])
      try:
        out = self._manager.restore(step, args=ocp.args.Composite(**{
            manager.STATE_ITEM: ocp.args.PyTreeRestore(
                item=on_replica,
                restore_args=ocp.checkpoint_utils.construct_restore_args(
                    on_replica)),
            manager.DATA_ITEM: ocp.args.JsonRestore()}))
        restored = jax.tree.leaves(out[manager.STATE_ITEM])
        reply["data"] = out[manager.DATA_ITEM]
      except Exception as e:  # Orbax and TensorStore raise many kinds.
        reply["error"] = (
            f"Checkpoint {self.step_path(step)} could not be restored"
            f" (corrupt, or saved from a different model or optimizer):"
            f" {manager.describe(e)}")
    reply = _broadcast_json(reply, source)
    if "error" in reply:
      raise manager.CheckpointError(reply["error"])
    if not isinstance(reply["data"], dict):
      raise manager.CheckpointError(
          f"Checkpoint {self.step_path(step)}: the '{manager.DATA_ITEM}' item"
          " is not a JSON object.")
    state = jax.tree.unflatten(treedef, self._copy_to_all(
        replica, leaves, restored))
    return (convert(state) if convert else state), reply["data"]

  def _copy_to_all(self, replica: int, leaves: list[Any],
                   restored: list[jax.Array] | None) -> list[jax.Array]:
    """`restored` (on `replica`'s devices; None off them) on every device,
    laid out as `leaves`."""
    axis = self._mesh.axis_names.index(REPLICA_AXIS)
    count = self._mesh.devices.shape[axis]
    stacked = []
    for i, leaf in enumerate(leaves):
      spec = leaf.sharding.spec
      if any(REPLICA_AXIS in (a if isinstance(a, tuple) else (a,))
             for a in spec):
        raise ValueError(
            f"The state's array {i} is split over the {REPLICA_AXIS} axis"
            f" ({spec}): no replica holds all of it, so the peer tier cannot"
            " restore it; set checkpoint.local_peers=False.")
      sharding = jax.sharding.NamedSharding(
          self._mesh, jax.sharding.PartitionSpec(REPLICA_AXIS, *spec))
      shape = (count, *leaf.shape)
      held = ({s.device: s.data for s in restored[i].addressable_shards}
              if restored is not None else {})
      buffers = []
      for device, index in sharding.addressable_devices_indices_map(
          shape).items():
        if index[0].start == replica:
          buffers.append(held[device][None])
        else:
          rows = [len(range(*s.indices(n))) for s, n in zip(index, shape)]
          buffers.append(jax.device_put(np.zeros(rows, leaf.dtype), device))
      stacked.append(jax.make_array_from_single_device_arrays(
          shape, sharding, buffers))
    dtypes = tuple(leaf.dtype for leaf in leaves)
    merge = jax.jit(_merge, static_argnums=1,
                    out_shardings=tuple(leaf.sharding for leaf in leaves))
    return list(merge(tuple(stacked), dtypes))

  def quarantine(self, step: int) -> str:
    """Each process renames its own folder of `step`, if it has one."""
    path = self.step_path(step)
    new_path = f"{path}{manager.CORRUPT_MARK}{int(time.time())}"
    if os.path.isdir(path):
      os.rename(path, new_path)
    multihost_utils.sync_global_devices(f"quarantine local {step}")
    self.reload()
    return new_path
