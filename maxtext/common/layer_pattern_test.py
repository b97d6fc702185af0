"""Tests of the layer pattern: kinds, stack slots and the scan segments."""

import itertools
import random

from absl.testing import absltest

from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig

_BASE = ModelConfig.from_dict(dict(family="qwen3_moe", vocab_size=64,
                                   num_layers=10, embed_dim=32, mlp_dim=48,
                                   num_heads=4, num_kv_heads=2, head_dim=8))


def _cfg(**changes) -> ModelConfig:
  return _BASE.replace(**changes)


def _mixed(**changes) -> ModelConfig:
  """Dense first layer, experts every 2nd layer, every 4th layer global
  with its own head size: kinds dense, experts, global experts."""
  return _cfg(num_experts=4, num_experts_per_token=2, moe_mlp_dim=16,
              first_dense_layers=1, moe_layer_interval=2, sliding_window=3,
              global_layer_interval=4, global_head_dim=16,
              global_num_kv_heads=1, **changes)


def _names(cfg):
  return [layer.kind.name for layer in layer_pattern.layers(cfg)]


def _brute_force_cost(ids):
  """Fewest traced layers over every way to cut `ids` into periodic runs."""
  best = None
  count = len(ids)
  for cuts in itertools.product((False, True), repeat=count - 1):
    bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [count]
    cost = 0
    for start, end in zip(bounds, bounds[1:]):
      run = ids[start:end]
      cost += min(p for p in range(1, len(run) + 1)
                  if len(run) % p == 0 and run == run[:p] * (len(run) // p))
    best = cost if best is None else min(best, cost)
  return best


class LayerPatternTest(absltest.TestCase):

  def test_kinds_of_each_family_shape(self):
    self.assertEqual(set(_names(_cfg())), {"blocks"})
    deepseek = _cfg(num_experts=4, moe_mlp_dim=16, first_dense_layers=3)
    self.assertEqual(_names(deepseek), ["dense_blocks"] * 3 + ["blocks"] * 7)
    self.assertEqual(
        _names(_mixed()),
        ["dense_blocks", "blocks", "dense_blocks", "global_blocks"] * 2
        + ["dense_blocks", "blocks"])
    gemma4 = _cfg(sliding_window=3, global_layer_interval=5,
                  global_head_dim=16)
    self.assertEqual(_names(gemma4),
                     (["blocks"] * 4 + ["global_blocks"]) * 2)
    # Local and global layers of the same sizes are one kind, two windows.
    gemma3 = layer_pattern.layers(_cfg(sliding_window=3,
                                       global_layer_interval=5))
    self.assertLen({layer.kind for layer in gemma3}, 1)
    self.assertEqual([layer.window for layer in gemma3],
                     ([3] * 4 + [None]) * 2)

  def test_chunked_and_global_layers_are_one_kind(self):
    """Llama 4: three chunked layers, then a global one, all one kind;
    the chunk and the window are each layer's own."""
    layers = layer_pattern.layers(_cfg(attention_chunk_size=4,
                                       global_layer_interval=4))
    self.assertLen({layer.kind for layer in layers}, 1)
    self.assertEqual([layer.chunk for layer in layers],
                     ([4] * 3 + [None]) * 2 + [4] * 2)
    self.assertEqual({layer.window for layer in layers}, {None})
    self.assertEqual([layer.is_global for layer in layers],
                     ([False] * 3 + [True]) * 2 + [False] * 2)
    every = layer_pattern.layers(_cfg(attention_chunk_size=4,
                                      global_layer_interval=0))
    self.assertEqual({layer.chunk for layer in every}, {4})

  def test_a_kind_reads_its_own_sizes(self):
    cfg = _mixed()
    kinds = {kind.name: kind for kind in layer_pattern.kinds(cfg)}
    self.assertEqual(list(kinds), ["dense_blocks", "blocks", "global_blocks"])
    sized = kinds["global_blocks"].config(cfg)
    self.assertEqual(
        (sized.attention.head_dim, sized.attention.num_kv_heads), (16, 1))
    self.assertIs(kinds["blocks"].config(cfg), cfg)
    self.assertTrue(kinds["global_blocks"].experts)
    self.assertFalse(kinds["dense_blocks"].experts)

  def test_kv_shared_layers_read_the_last_earlier_layer_of_their_span(self):
    """Gemma 4 e2b's shape: the last layers are kinds without key and value
    projections (their MLP as wide as mlp_kv_shared_dim); the last earlier
    layer of each of their spans stores its keys and values."""
    cfg = _cfg(sliding_window=3, global_layer_interval=3, global_head_dim=16,
               kv_shared_layers=4, mlp_kv_shared_dim=96)
    layers = layer_pattern.layers(cfg)
    self.assertEqual(_names(cfg), ["blocks", "blocks", "global_blocks"] * 2
                     + ["shared_blocks", "shared_blocks",
                        "global_shared_blocks", "shared_blocks"])
    self.assertEqual([i for i, layer in enumerate(layers) if layer.stores_kv],
                     [4, 5])
    kinds = {kind.name: kind for kind in layer_pattern.kinds(cfg)}
    self.assertEqual(kinds["shared_blocks"].config(cfg).mlp.dim, 96)
    self.assertEqual(kinds["global_shared_blocks"].config(cfg).mlp.dim, 96)
    self.assertEqual(
        kinds["global_shared_blocks"].config(cfg).attention.head_dim, 16)
    self.assertEqual(kinds["blocks"].config(cfg).mlp.dim, 48)
    # Storing layers are unique, so their runs have one group.
    for segment in layer_pattern.segments(layers):
      run = layers[segment.start:segment.start + segment.period]
      if any(layer.stores_kv for layer in run):
        self.assertEqual(segment.groups, 1)
    with self.assertRaisesRegex(ValueError, "kv_shared_layers=8 is invalid: leaves no "
                                r"layer before layer 2 with the span \(global"
                                r"\)"):
      _cfg(sliding_window=3, global_layer_interval=3, kv_shared_layers=8)
    with self.assertRaisesRegex(ValueError, "kv_shared_layers=10 is invalid: must be "
                                "below num_layers=10"):
      _cfg(kv_shared_layers=10)
    with self.assertRaisesRegex(ValueError, "mlp_kv_shared_dim=96.*"
                                "kv_shared_layers=0"):
      _cfg(mlp_kv_shared_dim=96)
    with self.assertRaisesRegex(ValueError, "kv_shared_layers=-1"):
      _cfg(kv_shared_layers=-1)
    with self.assertRaisesRegex(ValueError, "kv_shared_layers=2 is invalid: needs "
                                'attention_type="gqa"'):
      _cfg(attention_type="mla", num_kv_heads=4, kv_lora_rank=8,
           qk_nope_head_dim=8, v_head_dim=8, kv_shared_layers=2)

  def test_kind_layers_and_slots_agree(self):
    cfg = _mixed()
    pattern = layer_pattern.layers(cfg)
    slots = layer_pattern.slots(pattern)
    for name, indices in layer_pattern.kind_layers(cfg).items():
      self.assertEqual([slots[i] for i in indices], list(range(len(indices))))
      self.assertTrue(all(pattern[i].kind.name == name for i in indices))
    self.assertEqual(layer_pattern.kind_layers(cfg)["global_blocks"], (3, 7))

  def test_segments_of_known_patterns(self):
    seg = layer_pattern.Segment
    gemma3 = layer_pattern.layers(_cfg(num_layers=26, sliding_window=3,
                                       global_layer_interval=6))
    self.assertEqual(layer_pattern.segments(gemma3),
                     (seg(0, 6, 4), seg(24, 1, 2)))
    deepseek = layer_pattern.layers(_cfg(num_layers=61, num_experts=4,
                                         moe_mlp_dim=16,
                                         first_dense_layers=3))
    self.assertEqual(layer_pattern.segments(deepseek),
                     (seg(0, 1, 3), seg(3, 1, 58)))
    self.assertEqual(layer_pattern.segments(layer_pattern.layers(_mixed())),
                     (seg(0, 4, 2), seg(8, 2, 1)))

  def test_segments_cover_the_layers_and_trace_the_fewest(self):
    rng = random.Random(0)
    for _ in range(150):
      ids = tuple(rng.choice("abc"[:rng.randint(1, 3)])
                  for _ in range(rng.randint(1, 9)))
      segments = layer_pattern.segments(ids)
      start = 0
      for segment in segments:
        self.assertEqual(segment.start, start)
        run = ids[start:start + segment.period * segment.groups]
        self.assertEqual(run, run[:segment.period] * segment.groups)
        start += segment.period * segment.groups
      self.assertEqual(start, len(ids), msg=ids)
      self.assertEqual(sum(s.period for s in segments),
                       _brute_force_cost(ids), msg=ids)

  def test_bad_kind_settings_name_the_field(self):
    with self.assertRaisesRegex(ValueError, "num_experts=0.*when "
                                "moe_layer_interval"):
      _cfg(moe_layer_interval=2)
    with self.assertRaisesRegex(ValueError, "moe_layer_interval=0"):
      _cfg(num_experts=4, moe_mlp_dim=16, moe_layer_interval=0)
    with self.assertRaisesRegex(ValueError, "moe_layer_interval=20.*no "
                                "expert layer"):
      _cfg(num_experts=4, moe_mlp_dim=16, moe_layer_interval=20)
    with self.assertRaisesRegex(ValueError, "global_head_dim=16.*every "
                                "layer is global"):
      _cfg(global_head_dim=16)
    with self.assertRaisesRegex(ValueError, "global_head_dim=7.*even"):
      _cfg(sliding_window=3, global_layer_interval=2, global_head_dim=7)
    with self.assertRaisesRegex(ValueError, "global_num_kv_heads=3.*divide"):
      _cfg(sliding_window=3, global_layer_interval=2, global_num_kv_heads=3)
    with self.assertRaisesRegex(ValueError, "global_head_dim=-1"):
      _cfg(global_head_dim=-1)
    with self.assertRaisesRegex(ValueError, "attention_chunk_size=4.*not "
                                "both"):
      _cfg(sliding_window=3, attention_chunk_size=4, global_layer_interval=2)
    with self.assertRaisesRegex(ValueError, "global_layer_interval=1.*"
                                "attention_chunk_size=4 is unused"):
      _cfg(attention_chunk_size=4)
    with self.assertRaisesRegex(ValueError, "attention_chunk_size=-2"):
      _cfg(attention_chunk_size=-2)
    with self.assertRaisesRegex(ValueError, "attn_temperature_scale=0.1.*"
                                "rope_global_nope=True"):
      _cfg(attn_temperature_scale=0.1)


if __name__ == "__main__":
  absltest.main()
