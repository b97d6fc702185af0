"""The golden sharding tables: which configs on which mesh, and their text."""

import os

import ml_collections

from configs import gemma3
from configs import llama3
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import report
from maxtext.trainers.config import ExperimentConfig

TESTDATA = os.path.join("tools", "sharding", "testdata")
# 2x2x2 over fsdp, tensor and sequence.
MESH_2X2X2 = dict(data=1, fsdp=2, tensor=2, sequence=2)
GOLDENS = {
    "gemma3_small_2x2x2.txt": (gemma3, MESH_2X2X2),
    "llama3_small_2x2x2.txt": (llama3, MESH_2X2X2),
}


def table_for_config(config: ml_collections.ConfigDict, num_devices: int,
                     num_slices: int = 1) -> str:
  """The parameter table of `config` on its mesh over `num_devices`."""
  experiment = ExperimentConfig.from_config_dict(config)
  shape = experiment.mesh.shape(num_devices, num_slices)
  mesh_shape = dict(zip(mesh_lib.AXES, shape))
  return report.parameter_table(experiment.model, mesh_shape,
                                experiment.sharding.param_rules)


def golden_text(name: str) -> str:
  """The current table of golden file `name`."""
  module, ici = GOLDENS[name]
  config = module.get_config()
  config.mesh.ici.update(ici)
  return table_for_config(config, num_devices=8)


def write_goldens(root: str) -> list[str]:
  """Rewrites every golden file under `root`; returns their paths."""
  paths = []
  for name in GOLDENS:
    path = os.path.join(root, TESTDATA, name)
    with open(path, "w") as f:
      f.write(golden_text(name))
    paths.append(path)
  return paths
