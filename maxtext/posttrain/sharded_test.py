"""Tests post-training on a sharded mesh: LoRA SFT with parameters split
over fsdp and tensor equals the data-parallel run.

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8).
"""

import os

from absl.testing import absltest
import jax

from maxtext.checkpoint import params_checkpoint
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import sft
from testing import devices
from testing import trees


def _axes(array: jax.Array) -> tuple:
  """The mesh axes of each dimension, trailing unsharded ones dropped."""
  spec = list(array.sharding.spec)
  while spec and spec[-1] is None:
    spec.pop()
  return tuple(spec)


class ShardedTest(absltest.TestCase):

  def test_fsdp_tensor_mesh_equals_data_parallel(self):
    devices.require_devices(8)
    folder = self.create_tempdir().full_path
    ckpt = pt.write_checkpoint(folder)
    train = pt.write_jsonl(os.path.join(folder, "train.jsonl"),
                           pt.mapping_records(32))
    exported = []
    for name, mesh in (("data", dict(data=-1)),
                       ("fsdp_tensor", dict(data=2, fsdp=2, tensor=2))):
      config = pt.sft_test_config(folder, ckpt, steps=3, train_file=train,
                                  mode="lora", rank=4)
      config.optimizer.learning_rate = 3e-2
      config.mesh.ici.update(mesh)
      result = sft.run(config, os.path.join(folder, name))
      if name == "fsdp_tensor":
        query = result.model.model.model.blocks[0].attention.query
        # [embed, heads, head_dim]; the adapter's B [rank, heads*head_dim]
        # follows the heads.
        self.assertEqual(_axes(query.kernel[...]), ("fsdp", "tensor"))
        self.assertEqual(_axes(query.kernel_lora_b[...]), (None, "tensor"))
      exported.append(params_checkpoint.load_params(
          result.exported["export"])[1])
    # Three steps with the gradients summed in another order: within 1e-5,
    # or 1e-4 of each leaf's largest magnitude; a wrong split is off by the
    # learning rate (3e-2).
    trees.assert_trees_close(exported[0], exported[1], rtol=1e-4, atol=1e-5,
                             scaled_atol=1e-4)


if __name__ == "__main__":
  absltest.main()
