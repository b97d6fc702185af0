"""A decoder's layers as a pattern of layer kinds.

A layer kind is what a layer's parameters are: its block (attention with its
sizes, then a dense MLP or routed experts). Each kind has its own parameter
stack, the `Decoder` attribute named after the kind. A layer is its kind and
its attention span (a sliding window, an attention chunk or neither), which
changes what the layer computes but not its parameters: Gemma 2/3's local
and global layers are one kind with two windows, Llama 4's chunked and NoPE
layers one kind, DeepSeek's dense first layers another kind than its expert
layers.

Kinds, by what a `ModelConfig` sets:
  "blocks": attention and the model's feed-forward: routed experts with
    num_experts > 0, else the MLP. The layers of every family.
  "dense_blocks": attention and a dense MLP in a model with experts: the
    first `first_dense_layers` (DeepSeek) and the layers between expert
    layers (`moe_layer_interval` > 1: Llama 4).
  "global_blocks", "global_dense_blocks": either of the above for a global
    (full attention) layer whose attention has sizes of its own
    (`global_head_dim`, `global_num_kv_heads`: Gemma 4).
  "linear_blocks", "linear_dense_blocks": a Gated DeltaNet layer
    (`ModelConfig.linear_attention`: Qwen3-Next, Qwen3.5) in place of
    attention, with the model's feed-forward or the dense MLP.
  "shared_..." (after "global_"): a layer among the last `kv_shared_layers`,
    which has no key and value projections: it attends over the keys and
    values of the last earlier layer with its span (sliding window or
    chunk, or neither), the layer that `stores_kv` (Gemma 4 e2b, e4b).
The names keep the parameter paths of checkpoints written before kinds.

Running: `segments(layers)` cuts the layers into runs, each a pattern of
`period` layers repeated `groups` times. The decoder scans a run over its
groups, tracing one group, so compile time grows with the sum of the
periods, which `segments` makes as small as it can be.
"""

import collections
import dataclasses
import functools
from typing import TYPE_CHECKING, ClassVar

from maxtext.common import sections

if TYPE_CHECKING:  # model_config builds its pattern from this module.
  from maxtext.common.model_config import ModelConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PatternConfig:
  """Which layers are local or global and which have experts
  (`ModelConfig.pattern`).

  Attributes (their `model` section keys in `KEYS`):
    sliding_window: Keys a local layer's query sees, itself included; 0:
      no sliding window.
    attention_chunk_size: A local layer's query sees only the keys of its
      own chunk of this many positions (positions p with equal
      p // attention_chunk_size; Llama 4), instead of a sliding window; 0:
      no chunks. Without either, every layer is global.
    global_layer_interval: With a sliding window or chunks, layer `i`
      (0-based) is global when `(i + 1) % global_layer_interval == 0` and
      local otherwise; 0: every layer is local.
    first_dense_layers: In a model with experts, the first this-many layers
      have a dense MLP instead (DeepSeek's first_k_dense_replace).
    moe_layer_interval: After those, layer `i` has experts when
      `(i + 1) % moe_layer_interval == 0` and the dense MLP otherwise
      (Llama 4's interleave_moe_layer_step); 1: every one has experts.
    kv_shared_layers: The last this-many layers compute no keys and values
      of their own: each attends over those of the last earlier layer with
      its span (Gemma 4's num_kv_shared_layers); 0: none.
  """

  KEYS: ClassVar[dict[str, str]] = {
      "sliding_window": "sliding_window",
      "attention_chunk_size": "attention_chunk_size",
      "global_layer_interval": "global_layer_interval",
      "first_dense_layers": "first_dense_layers",
      "moe_layer_interval": "moe_layer_interval",
      "kv_shared_layers": "kv_shared_layers",
  }

  sliding_window: int = 0
  attention_chunk_size: int = 0
  global_layer_interval: int = 1
  first_dense_layers: int = 0
  moe_layer_interval: int = 1
  kv_shared_layers: int = 0

  def __post_init__(self):
    def fail(field, valid):
      sections.fail_part(self, field, valid)

    for name in ("sliding_window", "attention_chunk_size",
                 "global_layer_interval", "first_dense_layers",
                 "kv_shared_layers"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(name, "must be an integer >= 0 (0 turns it off)")
    interval = self.moe_layer_interval
    if isinstance(interval, bool) or not isinstance(interval, int) or (
        interval < 1):
      fail("moe_layer_interval", "must be a positive integer")
    if self.sliding_window and self.attention_chunk_size:
      fail("attention_chunk_size",
           f"local layers have a sliding window ({self.sliding_window}) or "
           "chunks, not both; set one of them to 0")
    span = ("sliding_window" if self.sliding_window else
            "attention_chunk_size" if self.attention_chunk_size else None)
    if span is None and self.global_layer_interval != 1:
      fail("global_layer_interval", "must be 1 when sliding_window=0 and "
           "attention_chunk_size=0 (every layer is global)")
    if span is not None and self.global_layer_interval == 1:
      fail("global_layer_interval",
           f"1 makes every layer global, so {span}={getattr(self, span)} is"
           f" unused; use 0 for all-local layers or set {span}=0")

  def _local(self, num_layers: int) -> tuple[bool, ...]:
    """Whether each layer is local (a sliding window or chunks)."""
    if not (self.sliding_window or self.attention_chunk_size):
      return (False,) * num_layers
    interval = self.global_layer_interval
    return tuple(not (interval and (i + 1) % interval == 0)
                 for i in range(num_layers))

  def windows(self, num_layers: int) -> tuple[int | None, ...]:
    """Sliding window of each layer; None for a layer without one."""
    return tuple(self.sliding_window if local and self.sliding_window
                 else None for local in self._local(num_layers))

  def chunks(self, num_layers: int) -> tuple[int | None, ...]:
    """Attention chunk of each layer; None for a layer without chunks."""
    return tuple(self.attention_chunk_size
                 if local and self.attention_chunk_size else None
                 for local in self._local(num_layers))

  def moe_layer(self, layer: int, num_experts: int) -> bool:
    """Whether layer `layer` (0-based) of a model with `num_experts` routed
    experts has them instead of a dense MLP."""
    return (num_experts > 0 and layer >= self.first_dense_layers
            and (layer + 1) % self.moe_layer_interval == 0)


@dataclasses.dataclass(frozen=True)
class LayerKind:
  """What a layer's parameters are; `name` is its stack on the decoder.

  Attributes:
    name: The decoder attribute holding this kind's parameter stack.
    experts: Routed experts in place of the dense MLP.
    global_sizes: Attention of `global_head_dim` and `global_num_kv_heads`.
    kv_shared: No key and value projections: the layer attends over an
      earlier layer's keys and values; its MLP is `mlp.kv_shared_dim` wide.
    linear: A Gated DeltaNet layer (`maxtext.layers.gated_deltanet`) in
      place of attention.
  """
  name: str
  experts: bool
  global_sizes: bool = False
  kv_shared: bool = False
  linear: bool = False

  def config(self, cfg: "ModelConfig") -> "ModelConfig":
    """`cfg` as this kind's blocks read it: its attention sizes and MLP
    width in place of the model's."""
    attention, mlp = cfg.attention, cfg.mlp
    if self.global_sizes:
      attention = attention.global_sizes()
    if self.kv_shared and mlp.kv_shared_dim:
      mlp = dataclasses.replace(mlp, dim=mlp.kv_shared_dim)
    if (attention, mlp) == (cfg.attention, cfg.mlp):
      return cfg
    return dataclasses.replace(cfg, attention=attention, mlp=mlp)


@dataclasses.dataclass(frozen=True)
class Layer:
  """One decoder layer: its kind, its sliding window and its attention
  chunk (None: none; a layer with neither is global); `stores_kv`: later
  layers of its span (`kv_shared` kinds) attend over its keys and values."""
  kind: LayerKind
  window: int | None
  chunk: int | None = None
  stores_kv: bool = False

  @property
  def is_global(self) -> bool:
    return self.window is None and self.chunk is None

  @property
  def span(self) -> tuple[int | None, int | None]:
    """(window, chunk): layers with equal spans can share keys and values."""
    return self.window, self.chunk


@dataclasses.dataclass(frozen=True)
class Segment:
  """Layers start .. start + period * groups - 1: `groups` repetitions of
  the `period` layers from `start`."""
  start: int
  period: int
  groups: int


def layers(cfg: "ModelConfig") -> tuple[Layer, ...]:
  """Every layer of `cfg`, in order."""
  global_sizes = cfg.attention.global_sizes_key() is not None
  spans = list(zip(cfg.layer_windows(), cfg.pattern.chunks(cfg.num_layers)))
  first_shared = cfg.num_layers - cfg.pattern.kv_shared_layers
  stores = kv_sources(spans, first_shared).values()
  linear = cfg.linear_attention.linear_layers(cfg.num_layers)
  result = []
  for index, (window, chunk) in enumerate(spans):
    experts = cfg.moe_layer(index)
    sized = global_sizes and window is None and chunk is None
    shared = index >= first_shared
    name = ("linear_" if linear[index] else "") + (
        "global_" if sized else "") + ("shared_" if shared else "") + (
            "dense_" if cfg.moe.num_experts and not experts else "") + "blocks"
    result.append(Layer(LayerKind(name, experts, sized, shared,
                                  linear[index]), window, chunk,
                        stores_kv=index in stores))
  return tuple(result)


def kv_sources(spans: list[tuple[int | None, int | None]],
               first_shared: int) -> dict[tuple[int | None, int | None],
                                          int | None]:
  """{span of a layer from `first_shared` on: the last earlier layer with
  that span (None if there is none)}, spans being each layer's (window,
  chunk)."""
  return {span: max((i for i in range(first_shared) if spans[i] == span),
                    default=None)
          for span in spans[first_shared:]}


def kind_counts(cfg: "ModelConfig") -> dict[LayerKind, int]:
  """{kind: its number of layers}, in order of the kinds' first layers."""
  return dict(collections.Counter(layer.kind for layer in layers(cfg)))


def kinds(cfg: "ModelConfig") -> tuple[LayerKind, ...]:
  """The distinct layer kinds of `cfg`, in order of their first layer."""
  return tuple(kind_counts(cfg))


def kind_layers(cfg: "ModelConfig") -> dict[str, tuple[int, ...]]:
  """{kind name: the model layers of that kind, in order}: entry j of a
  kind's stack is layer `kind_layers(cfg)[name][j]`."""
  result = {}
  for index, layer in enumerate(layers(cfg)):
    result.setdefault(layer.kind.name, []).append(index)
  return {name: tuple(indices) for name, indices in result.items()}


def slots(pattern: tuple[Layer, ...]) -> tuple[int, ...]:
  """Each layer's index in its kind's stack."""
  seen: dict[LayerKind, int] = {}
  result = []
  for layer in pattern:
    result.append(seen.get(layer.kind, 0))
    seen[layer.kind] = result[-1] + 1
  return tuple(result)


def segments(pattern: tuple[Layer, ...]) -> tuple[Segment, ...]:
  """The runs of `pattern` that trace the fewest layers (then the fewest
  runs, then the longest first): e.g. 26 Gemma 3 layers (5 local, 1
  global) -> 4 groups of 6, then 2 groups of 1; 3 dense then 58 expert
  layers -> 3 groups of 1, then 58 of 1."""
  ids = {}
  return _segments(tuple(ids.setdefault(layer, len(ids)) for layer in pattern))


@functools.lru_cache(maxsize=64)
def _segments(ids: tuple[int, ...]) -> tuple[Segment, ...]:
  count = len(ids)
  # best[i]: (layers traced, runs, -layers in the first run, first run) for
  # layers i..count-1: the fewest traced, then the fewest runs, then the
  # longest first run.
  best = [(0, 0, 0, None)] * (count + 1)
  for start in range(count - 1, -1, -1):
    options = []
    for period in range(1, count - start + 1):
      end = start + period  # Past the layers of `groups` whole groups.
      while True:
        traced, runs, _, _ = best[end]
        groups = (end - start) // period
        options.append((traced + period, runs + 1, start - end,
                        Segment(start, period, groups)))
        if end + period > count or (
            ids[end:end + period] != ids[start:start + period]):
          break
        end += period
    best[start] = min(options, key=lambda option: option[:3])
  result, start = [], 0
  while start < count:
    segment = best[start][3]
    result.append(segment)
    start += segment.period * segment.groups
  return tuple(result)
