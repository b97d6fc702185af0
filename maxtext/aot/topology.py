"""Compile targets by name: TPU slices, CPU and GPU device counts.

`parse_topology(name, num_slices)` reads the `--topology` of `aot_compile`:

  v5e-256, v6e-16     chips of a v5e / v6e slice (1, 4, 8, ..., 256);
  v4-8, v5p-128       TensorCores of a v4 / v5p slice (two per chip, one JAX
                      device per chip: megacore);
  v5e:2x2, v5p:4x4x12 the chip grid itself (any shape libtpu accepts);
  cpu:8               8 CPU devices of this process (the result can run here);
  h100:8, h200:8      8 GPUs of that kind per host, compile-only (no GPU
                      needed: jax's CUDA PJRT plugin compiles for the GPU
                      described by `GpuChip.target_config`); with
                      `num_slices=N`, N such hosts;
  gpu:8               8 GPUs per host on a host that has them; with
                      `num_slices=N`, N hosts mocked on this one.

`make_devices(target)` returns the devices to build the mesh on with their
memory, peak FLOP/s and memory bandwidth. For TPU they are compile-only
devices from `jax.experimental.topologies` (libtpu, which needs no TPU: this
works on a CPU-only host); slices beyond the first carry `slice_index`, so the
config's `mesh.dcn` sizes apply as on a real multi-slice job. For h100/h200
they are compile-only devices of the CUDA plugin (packages jax-cuda12-pjrt
and jax-cuda12-plugin at jax's version, without the CUDA libraries), which
loads on a CPU-only host while JAX's platforms are "cpu"
(`configure_backend`); hosts beyond the first differ in `process_index`
only (no `slice_index`), so `mesh.dcn` sizes stay 1 and the mesh spans all
hosts' GPUs. Under Bazel the plugin is `//maxtext/aot:cuda_plugin`
(@pypi_gpu); cuDNN attention also needs cuDNN's library, which JAX asks for
its version while tracing (`//maxtext/aot:cuda_plugin_cudnn`), and
`//maxtext/bin:aot_compile_gpu` has both.

`hardware_for(name, num_slices)` is `make_devices(parse_topology(...))` in
one call.
"""

import dataclasses
import math
import os
import re
from typing import Any

import jax
from jax.experimental import topologies

from maxtext.metrics import flops

_GIB = 2**30


@dataclasses.dataclass(frozen=True)
class TpuChip:
  """One TPU generation.

  Attributes:
    generation: The user-facing name: v4, v5e, v5p, v6e.
    libtpu_name: Its name in libtpu topology strings.
    dims: Dimensions of its chip grid (2 or 3).
    cores_in_name: TensorCores per chip counted in slice names (v4-8 is 4
      chips).
    hbm_bytes: HBM a program may use per chip (= per JAX device).
    hbm_bandwidth: HBM bytes/s per chip.
    max_chips: Chips of the largest slice.
    chip_config_name: libtpu's chip config ("megacore": one device per chip).
  """

  generation: str
  libtpu_name: str
  dims: int
  cores_in_name: int
  hbm_bytes: int
  hbm_bandwidth: float
  max_chips: int
  chip_config_name: str = "default"


# HBM a program may use per chip (= per JAX device), as the TPU compiler
# reports it when a program does not fit (libtpu 0.0.42: "exceeds available
# HBM (15.75G)"; the rest of the 16/32/96 GiB is reserved), and datasheet HBM
# bandwidth (Cloud TPU system architecture pages).
TPU_CHIPS = {
    "v4": TpuChip("v4", "v4", 3, 2, int(30.75 * _GIB), 1.2e12, 4096,
                  "megacore"),
    "v5e": TpuChip("v5e", "v5e", 2, 1, int(15.75 * _GIB), 819e9, 256),
    "v5p": TpuChip("v5p", "v5p", 3, 2, int(95.74 * _GIB), 2765e9, 8960,
                   "megacore"),
    "v6e": TpuChip("v6e", "v6e", 2, 1, int(31.25 * _GIB), 1640e9, 256),
}
# Other spellings of a generation.
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}

@dataclasses.dataclass(frozen=True)
class GpuChip:
  """One GPU model that can be compiled for without a GPU.

  Attributes:
    name: The user-facing name in `--topology`, e.g. "h100".
    device_kind: Its CUDA name (the compiled devices' `device_kind`).
    memory_bytes: Device memory as CUDA reports it.
    memory_bandwidth: HBM bytes/s.
  """

  name: str
  device_kind: str
  memory_bytes: int
  memory_bandwidth: float

  @property
  def usable_bytes(self) -> int:
    """What JAX's allocator takes by default (XLA_PYTHON_CLIENT_MEM_FRACTION
    0.75), as `memory_stats()["bytes_limit"]` reports on a real GPU."""
    return int(0.75 * self.memory_bytes)

  def target_config(self) -> str:
    """XLA's GpuTargetConfigProto (text) describing this GPU: the Hopper
    (SM 9.0, 132 SMs) figures of XLA's gpu_specs/h100_sxm.txtpb with this
    chip's memory, bandwidth and name."""
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.memory_bandwidth)}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
device_description_str: "{self.device_kind}"
"""


# Hopper GPUs (SXM) by name: memory as CUDA reports it (H100: XLA's
# h100_sxm.txtpb; H200: 143771 MiB, as nvidia-smi shows) and datasheet HBM
# bandwidth.
GPU_CHIPS = {
    "h100": GpuChip("h100", "NVIDIA H100 80GB HBM3", 84_978_434_048,
                    3.35232e12),
    "h200": GpuChip("h200", "NVIDIA H200", 143_771 * 2**20, 4.8e12),
}

# HBM bytes/s per GPU, matched against `device_kind` in order.
GPU_BANDWIDTH_BY_DEVICE_KIND = (
    (r"B200", 8.0e12),
    (r"H200", 4.8e12),
    (r"H100 PCIe", 2.0e12),
    (r"H100", 3.35e12),
    (r"A100", 2.0e12),
)

_EXAMPLES = ("v5e-256, v5p-8, v4-8, v6e-16, v5e:2x2, v5p:2x2x4, cpu:8,"
             " h100:8, h200:8, gpu:8")


@dataclasses.dataclass(frozen=True)
class Target:
  """A compile target.

  Attributes:
    name: The name as given (`--topology`).
    platform: "tpu", "cpu" or "gpu".
    num_slices: Slices (TPU) or hosts (GPU) joined by the data-center
      network.
    devices_per_slice: JAX devices in one slice.
    grid: TPU chip grid of one slice, e.g. (16, 16); () otherwise.
    chip: The TPU generation; None otherwise.
    gpu: The GPU compiled for without a GPU (h100:8); None otherwise
      (gpu:8 uses the attached GPUs).
  """

  name: str
  platform: str
  num_slices: int
  devices_per_slice: int
  grid: tuple[int, ...] = ()
  chip: TpuChip | None = None
  gpu: GpuChip | None = None

  @property
  def num_devices(self) -> int:
    return self.num_slices * self.devices_per_slice

  @property
  def libtpu_topology(self) -> str:
    """libtpu's name of one slice, e.g. "v5e:16x16"."""
    return f"{self.chip.libtpu_name}:{'x'.join(map(str, self.grid))}"


@dataclasses.dataclass(frozen=True)
class Hardware:
  """The devices of a target and what one of them offers.

  Attributes:
    target: The target.
    devices: Its devices (compile-only for TPU).
    memory_bytes: Memory one device may use (TPU/GPU HBM; for CPU the host's
      memory divided among the devices).
    memory_name: What `memory_bytes` is, for reports.
    peak_flops: Dense bf16 FLOP/s of one device; 0 when unknown.
    memory_bandwidth: Memory bytes/s of one device; 0 when unknown.
  """

  target: Target
  devices: tuple[Any, ...]
  memory_bytes: int
  memory_name: str
  peak_flops: float
  memory_bandwidth: float

  @property
  def device_kind(self) -> str:
    return self.devices[0].device_kind


def _bad_name(name: str, why: str) -> ValueError:
  return ValueError(f"--topology={name!r}: {why}. Valid forms: {_EXAMPLES}"
                    f" (TPU generations: {sorted(TPU_CHIPS)}).")


def slice_grid(chip: TpuChip, chips: int) -> tuple[int, ...]:
  """The usual chip grid of a slice of `chips` (a power of two).

  Starting from 2x2 (2x2x1), each doubling doubles the last of the smallest
  dimensions: 2x4, 4x4, 4x8, ... and 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...
  """
  if chips == 1:
    return (1,) * chip.dims
  grid = [2, 2] + [1] * (chip.dims - 2)
  while math.prod(grid) < chips:
    smallest = min(grid)
    last = max(i for i, size in enumerate(grid) if size == smallest)
    grid[last] *= 2
  return tuple(grid)


def _parse_tpu(name: str, generation: str, size: str,
               num_slices: int) -> Target:
  chip = TPU_CHIPS[_ALIASES.get(generation, generation)]
  if ":" in name:
    try:
      grid = tuple(int(d) for d in size.split("x"))
    except ValueError:
      raise _bad_name(name, f"{size!r} is not a chip grid like 2x2") from None
    if len(grid) != chip.dims or min(grid) < 1:
      raise _bad_name(name, f"a {chip.generation} grid has {chip.dims}"
                      " positive dimensions")
  else:
    chips, rest = divmod(int(size), chip.cores_in_name)
    named = _named_chip_counts(chip)
    if rest or chips not in named:
      unit = "TensorCores" if chip.cores_in_name > 1 else "chips"
      raise _bad_name(
          name, f"{chip.generation} slices by name have"
          f" {[n * chip.cores_in_name for n in named]} {unit}; name other"
          f" shapes by their grid, e.g. {chip.generation}:"
          + "x".join(["4"] * chip.dims))
    grid = slice_grid(chip, chips)
  return Target(name=name, platform="tpu", num_slices=num_slices,
                devices_per_slice=math.prod(grid), grid=grid, chip=chip)


def _named_chip_counts(chip: TpuChip) -> list[int]:
  """Chip counts of the slices named by size: 1 (2D only), 4, 8, 16, ..."""
  counts = [1] if chip.dims == 2 else []
  count = 4
  while count <= chip.max_chips:
    counts.append(count)
    count *= 2
  return counts


def parse_topology(name: str, num_slices: int = 1) -> Target:
  """The target named `name` (see the module docstring).

  Raises:
    ValueError: the name or slice count is invalid (the message shows the
      valid forms).
  """
  if isinstance(num_slices, bool) or not isinstance(
      num_slices, int) or num_slices < 1:
    raise ValueError(f"--num_slices={num_slices!r} must be a positive"
                     " integer.")
  text = name.strip().lower()
  match = re.fullmatch(r"(cpu|gpu|[a-z]\d+):(\d+)", text)
  if match and (match.group(1) in ("cpu", "gpu") or
                match.group(1) in GPU_CHIPS):
    platform, count = match.group(1), int(match.group(2))
    if count < 1:
      raise _bad_name(name, "the device count must be positive")
    if platform == "cpu" and num_slices != 1:
      raise ValueError(f"--num_slices={num_slices}: CPU devices have no"
                       " slices; use cpu:N with --num_slices=1.")
    return Target(name=name, platform="cpu" if platform == "cpu" else "gpu",
                  num_slices=num_slices, devices_per_slice=count,
                  gpu=GPU_CHIPS.get(platform))
  match = re.fullmatch(r"([a-z0-9]+?)(?:-(\d+)|:([0-9x]+))", text)
  if match is None or _ALIASES.get(match.group(1),
                                    match.group(1)) not in TPU_CHIPS:
    raise _bad_name(name, "unknown topology")
  return _parse_tpu(text, match.group(1), match.group(2) or match.group(3),
                    num_slices)


def configure_backend(target: Target) -> None:
  """Sets up the local backend for `target`; call before JAX starts it.

  CPU: asks for `devices_per_slice` CPU devices. Compile-only GPUs (h100:8):
  JAX runs on the CPU, so the CUDA plugin loads without a GPU (it is not
  initialised as a backend). GPU with several slices: mocks that many hosts
  on this one. TPU needs nothing (its devices are compile-only). Once JAX's
  backends are up these settings cannot change; `make_devices` then reports
  a device count that does not fit.
  """
  try:
    if target.platform == "cpu":
      jax.config.update("jax_num_cpu_devices", target.devices_per_slice)
    elif target.gpu is not None:
      jax.config.update("jax_platforms", "cpu")
    elif target.platform == "gpu" and target.num_slices > 1:
      jax.config.update("jax_mock_gpu_topology",
                        f"{target.num_slices}x1x{target.devices_per_slice}")
  except RuntimeError:
    # Backends already initialised (e.g. in tests with XLA_FLAGS); the device
    # count is checked against the target in make_devices.
    pass


def _tpu_devices(target: Target) -> list[Any]:
  # Compile-only devices need libtpu but no TPU; another process holding
  # libtpu's lock file (e.g. a second compile) must not block this one.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  chip = target.chip
  wrap = (tuple(size >= 16 for size in target.grid) + (False,)
          if chip.dims == 2 else
          (all(size % 4 == 0 for size in target.grid),) * 3)
  options = dict(num_slices=target.num_slices, wrap=wrap,
                 chip_config_name=chip.chip_config_name)
  if math.prod(target.grid) == 1:
    options["chips_per_host_bounds"] = (1, 1, 1)
  try:
    topology = topologies.get_topology_desc(
        target.libtpu_topology, platform="tpu", **options)
  except RuntimeError as e:  # jax's JaxRuntimeError; also "no libtpu".
    raise ValueError(
        f"--topology={target.name!r}: libtpu cannot make"
        f" {target.libtpu_topology} ({' '.join(str(e).split())[:300]})."
        " Install libtpu (jax[tpu]) and use a slice shape libtpu knows.") from e
  return list(topology.devices)


def _compile_only_gpus(target: Target) -> list[Any]:
  gpu = target.gpu
  try:
    topology = topologies.get_topology_desc(
        platform="cuda", target_config=gpu.target_config(),
        topology=f"1x{target.num_slices}x{target.devices_per_slice}")
  except (NotImplementedError, RuntimeError) as e:
    raise ValueError(
        f"--topology={target.name!r}: JAX cannot make compile-only"
        f" {gpu.device_kind} devices ({' '.join(str(e).split())[:300]})."
        " They need jax's CUDA PJRT plugin, the packages jax-cuda12-pjrt and"
        f" jax-cuda12-plugin at jax's version ({jax.__version__}; no GPU and"
        " no CUDA libraries needed), and JAX on the CPU platform"
        " (JAX_PLATFORMS=cpu, which aot_compile sets); under Bazel run"
        " //maxtext/bin:aot_compile_gpu or depend on"
        " //maxtext/aot:cuda_plugin. Without them use gpu:N on a host with"
        " N GPUs, or a TPU or cpu:N target.") from e
  return list(topology.devices)


def make_devices(target: Target) -> Hardware:
  """The devices of `target` and their memory, peak FLOP/s and bandwidth.

  Raises:
    ValueError: the target cannot be made here (names what is missing:
      libtpu, GPUs, or the CPU device count and how to set it).
  """
  if target.platform == "tpu":
    devices = _tpu_devices(target)
    chip = target.chip
    return Hardware(
        target=target, devices=tuple(devices), memory_bytes=chip.hbm_bytes,
        memory_name=f"{chip.generation} HBM",
        peak_flops=flops.peak_flops_per_device(devices[0].device_kind),
        memory_bandwidth=chip.hbm_bandwidth)
  if target.gpu is not None:
    gpu = target.gpu
    devices = _compile_only_gpus(target)
    return Hardware(
        target=target, devices=tuple(devices), memory_bytes=gpu.usable_bytes,
        memory_name=f"{gpu.name.upper()} HBM x 0.75",
        peak_flops=flops.peak_flops_per_device(gpu.device_kind),
        memory_bandwidth=gpu.memory_bandwidth)
  try:
    devices = jax.devices(target.platform)
  except RuntimeError:
    devices = []
  if len(devices) != target.num_devices:
    if target.platform == "cpu":
      how = ("call topology.configure_backend before JAX starts, or set"
             " XLA_FLAGS=--xla_force_host_platform_device_count="
             f"{target.num_devices}")
    else:
      how = (f"run on a host with {target.devices_per_slice} GPUs and jax's"
             " CUDA plugin (jax[cuda12]); more hosts are mocked with"
             " --num_slices")
    raise ValueError(
        f"--topology={target.name!r} needs {target.num_devices}"
        f" {target.platform} devices, this process has {len(devices)}: {how}.")
  if target.platform == "cpu":
    host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware(
        target=target, devices=tuple(devices),
        memory_bytes=host_bytes // len(devices),
        memory_name=f"host memory / {len(devices)}", peak_flops=0.0,
        memory_bandwidth=0.0)
  kind = devices[0].device_kind
  bandwidth = next((b for pattern, b in GPU_BANDWIDTH_BY_DEVICE_KIND
                    if re.search(pattern, kind)), 0.0)
  return Hardware(
      target=target, devices=tuple(devices),
      memory_bytes=devices[0].memory_stats()["bytes_limit"],
      memory_name=f"{kind} memory",
      peak_flops=flops.peak_flops_per_device(kind),
      memory_bandwidth=bandwidth)


def hardware_for(name: str, num_slices: int = 1) -> Hardware:
  """`make_devices(parse_topology(name, num_slices))`: the devices of the
  target named `name`, for callers that need not see the `Target` (tests,
  tools); `aot_compile` parses first to call `configure_backend` in between.

  Raises:
    ValueError: as `parse_topology` (a bad name or slice count) and
      `make_devices` (a target that cannot be made here).
  """
  return make_devices(parse_topology(name, num_slices))
