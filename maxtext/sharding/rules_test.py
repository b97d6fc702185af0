"""Tests for maxtext.sharding.rules."""

from absl.testing import absltest
import jax
from jax.sharding import PartitionSpec as P
import numpy as np

from configs import common
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib

_MESH = dict(data=1, fsdp=2, fsdp_transpose=1, sequence=2, tensor=2, expert=1,
             stage=1)


def _spec(names, shape, rules=None):
  rules = rules_lib.normalize_rules("param_rules",
                                    rules or common.PARAM_RULES)
  return rules_lib.logical_to_mesh(names, shape, rules, _MESH)


class RulesTest(absltest.TestCase):

  def test_default_parameter_layout(self):
    self.assertEqual(_spec(("vocab", "embed"), (64, 16)),
                     P("tensor", ("fsdp", "sequence")))
    self.assertEqual(_spec(("layers", "embed", "heads", "head_dim"),
                           (2, 16, 4, 8)),
                     P(None, ("fsdp", "sequence"), "tensor", None))

  def test_first_fit_falls_back_then_replicates(self):
    # embed=6: fsdp*sequence=4 does not divide it, fsdp=2 does.
    self.assertEqual(_spec(("embed",), (6,)), P("fsdp"))
    # One key/value head cannot be split over tensor=2: replicated.
    self.assertEqual(_spec(("embed", "kv_heads"), (16, 1)),
                     P(("fsdp", "sequence"), None))
    # A mesh axis is used once per array: the second "a" dim falls back.
    rules = (("a", ("tensor",)), ("a", ("fsdp",)))
    self.assertEqual(_spec(("a", "a"), (4, 4), rules), P("tensor", "fsdp"))
    self.assertEqual(_spec(("unknown",), (4,)), P(None))

  def test_invalid_rules_are_named(self):
    with self.assertRaisesRegex(ValueError, r"unknown mesh axes \['model'\]"):
      rules_lib.normalize_rules("param_rules", [("embed", ("model",))])
    with self.assertRaisesRegex(ValueError, "is not a pair"):
      rules_lib.normalize_rules("compute_rules", [("embed",)])

  def test_constrain_and_batch_sharding(self):
    devices = jax.devices()[:1]
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(), devices)
    rules = rules_lib.LogicalRules.from_config(
        mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))
    self.assertEqual(rules.batch_sharding((4, 8)).spec, P(None, None))
    self.assertEqual(rules.batch_shards(), 1)

  def test_zero1_adds_data_to_the_first_dimension_it_divides(self):
    mesh_shape = dict(_MESH, data=4)
    self.assertEqual(
        rules_lib.add_mesh_axis(P(None, "fsdp"), (64, 16), "data",
                                mesh_shape), P("data", "fsdp"))
    # 6 rows do not split 4 ways; 16 / (fsdp=2 * data=4) does.
    self.assertEqual(
        rules_lib.add_mesh_axis(P(None, "fsdp"), (6, 16), "data",
                                mesh_shape), P(None, ("data", "fsdp")))
    self.assertEqual(
        rules_lib.add_mesh_axis(P(), (6,), "data", mesh_shape), P())
    self.assertEqual(
        rules_lib.add_mesh_axis(P(None), (8,), "data", _MESH), P(None))

  def test_offload_names_a_backend_without_pinned_host_memory(self):

    class _Device:
      platform = "fakeplatform"

      def addressable_memories(self):
        return []

    class _Mesh:
      devices = np.array([_Device()])

    with self.assertRaisesRegex(
        ValueError, r'offload_optimizer_state=True needs "pinned_host"'
        r" memory; fakeplatform devices have \[\]"):
      rules_lib.LogicalRules(_Mesh(), (), (), offload_optimizer_state=True)

  def test_layout_options_must_be_booleans(self):
    with self.assertRaisesRegex(ValueError, "sharding.zero1=1 must be True"):
      rules_lib.ShardingConfig(**{**common.sharding_defaults(), "zero1": 1})


if __name__ == "__main__":
  absltest.main()
