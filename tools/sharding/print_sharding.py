r"""Prints the sharding of every parameter of a config on a mesh.

For each parameter: shape, logical axis names, the mesh PartitionSpec given by
the config's `sharding.param_rules`, and bytes per device. No devices are
needed: the mesh is the config's `mesh` section resolved for --num_devices.

  tools/bazel run //tools/sharding:print_sharding -- \
      --config=configs/gemma3.py --num_devices=8 --config.mesh.ici.data=1 \
      --config.mesh.ici.fsdp=2 --config.mesh.ici.tensor=2 \
      --config.mesh.ici.sequence=2

Regenerate the golden tables of print_sharding_test with --update_goldens
(writes tools/sharding/testdata/*.txt in the source tree):

  tools/bazel run //tools/sharding:print_sharding -- --update_goldens
"""

import os
import sys

from absl import app
from absl import flags

from maxtext.common import config_flag
from maxtext.common import paths
from tools.sharding import goldens

_CONFIG = config_flag.define_config_file("config", "Config file.")
_NUM_DEVICES = flags.DEFINE_integer("num_devices", 8,
                                    "Devices of the mesh.")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices (DCN).")
_UPDATE = flags.DEFINE_bool(
    "update_goldens", False,
    "Rewrite tools/sharding/testdata/*.txt instead of printing.")


def main(argv):
  del argv
  if _UPDATE.value:
    root = os.environ.get("BUILD_WORKSPACE_DIRECTORY", os.getcwd())
    for path in goldens.write_goldens(root):
      print(f"wrote {path}")
    return
  if _CONFIG.value is None:
    raise app.UsageError("--config is required (or --update_goldens).")
  print(goldens.table_for_config(_CONFIG.value, _NUM_DEVICES.value,
                                 _NUM_SLICES.value), end="")


if __name__ == "__main__":
  # A config path is relative to where the user ran `bazel run`.
  sys.argv = paths.resolve_config_argv(sys.argv)
  app.run(main)
