"""Pipelined training on 8 fake CPU devices equals one device: the circular
schedule, and stages whose local/global layer patterns differ.

JAX_NUM_CPU_DEVICES=8 (set by the Bazel target).
Each case compares the cross-entropy and the gradients of the train step's
objective (fp32) with the same weights run without a pipeline on one device.
On meshes of `data` and `stage` alone, the compiled step also shows that the
blocks' weights stay split over `stage`: none is all-gathered, and nothing
inside the schedule's loop moves one between devices.
"""

import functools
import re

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import optax

from configs import common
from configs import gemma3
from configs import llama3
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.layers import pipeline
from maxtext.models import execution
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import devices
from testing import trees

# Loss and gradients: float32, the schedules sum in different orders
# (measured: loss within 1.1e-7 relative; folding batch and length in the
# projections, `linear.fold_batch`, moved one tied-embedding gradient of
# 0.04 by 1.5e-6, over rtol 1e-5 alone). Gradients within _ATOL_SCALE of
# their leaf's largest magnitude: the same programs differ by up to 2.1e-5
# of it on another x86 CPU (the Llama circular schedules under the test
# XLA flags: 1.26e-5 on an embedding gradient of 0.33, leaf largest 0.87);
# a wrong stage, microbatch or repeat is off by the leaf's scale.
_RTOL = 1e-5
_ATOL_SCALE = 1e-4
# Only the MLP weights, their gradients and the MLP's hidden activations
# (which need no collective on these meshes) have a dimension of this size.
_MLP_DIM = 48
_FAMILIES = {"llama3": llama3, "gemma3": gemma3}


def _model_config(family: str, **overrides) -> ModelConfig:
  """The family's small config shrunk to tiny layers; Gemma 3 with window 4
  and every third layer global."""
  values = _FAMILIES[family].get_config().model.to_dict()
  values.update(vocab_size=64, embed_dim=16, mlp_dim=_MLP_DIM, num_heads=4,
                num_kv_heads=2, head_dim=8)
  if family == "gemma3":
    values.update(query_pre_attn_scalar=8.0, sliding_window=4,
                  global_layer_interval=3)
  values.update(overrides)
  return ModelConfig.from_dict(values)


def _state(model_config: ModelConfig, ici: dict[str, int], devices,
           pipeline_config=pipeline.PipelineConfig()):
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)), devices)
  rules = rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))
  # No update is taken: the optimizer plays no part.
  return train_state_lib.create_train_state(
      model_config, execution=execution.Execution(pipeline=pipeline_config),
      seed=0, tx=optax.identity(),
      schedule=optax.constant_schedule(0.0), z_loss=0.0, mesh=mesh,
      rules=rules)


def _batch(state, rows=8, length=8):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, size=(rows, length + 1), dtype=np.int32)
  mask = np.ones((rows, length), np.int32)
  mask[1, 5:] = 0
  sharding = state.rules.batch_sharding((rows, length))
  return {key: jax.device_put(value, sharding) for key, value in
          {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "mask": mask}.items()}


def _compiled_loss_and_grads(state, batch):
  """The compiled (loss, grads) of the train step's objective."""
  return jax.jit(lambda state, batch: train_step_lib.loss_and_grads(
      state, batch)[::2]).lower(state, batch).compile()


@functools.cache
def _single_device(family: str, layers: int, overrides=()):
  """(loss, grads) of the model without a pipeline on one device."""
  state = _state(_model_config(family, num_layers=layers, **dict(overrides)),
                 {"data": -1}, jax.devices()[:1])
  batch = _batch(state)
  return _compiled_loss_and_grads(state, batch)(state, batch)


def _weight_moves(hlo: str) -> list[str]:
  """Collectives of compiled `hlo` that move an MLP weight or its gradient
  between devices: any all-gather, and any all-to-all or collective permute
  inside a loop (the schedule's scan). All-reduces are left out: XLA may sum
  a layer's weight gradient over `data` inside the loop."""
  moves = []
  for line in hlo.splitlines():
    match = re.search(r"= (.*?) (all-gather|all-to-all|collective-permute)"
                      r"(-start)?\(", line)
    if not match or not any(str(_MLP_DIM) in dims.split(",") for dims in
                            re.findall(r"\[([\d,]*)\]", match.group(1))):
      continue
    if match.group(2) == "all-gather" or "/while/" in line:
      moves.append(line.strip()[:200])
  return moves


class PipelineScheduleTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  @parameterized.named_parameters(
      # Llama: 8 layers as 4 chunks of 2 on 2 stages, 8 chunks of 1 on 4.
      ("circular_2_stages", "llama3", 8, 2, 2, 4, {"data": 4, "stage": 2}),
      ("circular_4_stages", "llama3", 8, 4, 2, 4, {"data": 2, "stage": 4}),
      # Gemma 3, every third layer global: stages of 3 layers LLG and LLG
      # would agree; here they differ.
      ("gpipe_patterns_differ", "gemma3", 4, 2, 1, 2,
       {"data": 4, "stage": 2}),
      ("circular_patterns_differ_fsdp_tensor", "gemma3", 8, 2, 2, 2,
       {"fsdp": 2, "tensor": 2, "stage": 2}),
      # Two layer kinds: global layers with head dim 16 and one kv head
      # (`global_blocks`), stages of LLG and LLG, each kind's stack cut in
      # two.
      ("two_kinds", "gemma3", 6, 2, 1, 2, {"data": 4, "stage": 2},
       (("global_head_dim", 16), ("global_num_kv_heads", 1))),
  )
  def test_pipeline_equals_single_device(self, family, layers, stages,
                                         repeats, microbatches, ici,
                                         overrides=()):
    want_loss, want_grads = _single_device(family, layers, overrides)
    cfg = _model_config(family, num_layers=layers, **dict(overrides))
    self.assertLen(layer_pattern.kinds(cfg), 2 if overrides else 1)
    state = _state(cfg, {"data": 1, **ici}, jax.devices(),
                   pipeline.PipelineConfig(stages=stages, repeats=repeats,
                                           microbatches=microbatches))
    batch = _batch(state)
    compiled = _compiled_loss_and_grads(state, batch)
    loss, grads = compiled(state, batch)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=_RTOL)
    trees.assert_trees_close(grads, want_grads, rtol=_RTOL,
                             scaled_atol=_ATOL_SCALE)
    if set(ici) == {"data", "stage"}:
      self.assertEqual(_weight_moves(compiled.as_text()), [])


if __name__ == "__main__":
  absltest.main()
