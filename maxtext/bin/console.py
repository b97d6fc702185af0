"""The console scripts of the pip install (`pyproject.toml`): `maxtext-train`,
`maxtext-sft`, ... each start one binary of this folder.

The wheel installs our configs and test helpers as `maxtext.configs` and
`maxtext.testing` (no top-level packages of those names); config files and a
few modules import them as `configs` and `testing`, so a script makes those
names the installed packages before it imports its binary.
"""

import functools
import importlib
import importlib.util
import sys

from maxtext.common import host_memory

# Console script -> the module of `maxtext.bin` it starts.
SCRIPTS = {
    "maxtext-train": "train",
    "maxtext-sft": "sft",
    "maxtext-grpo": "grpo",
    "maxtext-distill": "distill",
    "maxtext-convert-ckpt": "convert_ckpt",
    "maxtext-aot-compile": "aot_compile",
    "maxtext-decode": "decode",
    "maxtext-eval": "eval",
}
# Packages the wheel installs under `maxtext.` that code imports without it.
BUNDLED = ("configs", "testing")


def alias_bundled_packages() -> None:
  """Makes `configs` and `testing` the wheel's `maxtext.configs` and
  `maxtext.testing`; outside a wheel (Bazel) there are none and nothing
  changes."""
  for name in BUNDLED:
    if importlib.util.find_spec(f"maxtext.{name}") is not None:
      sys.modules[name] = importlib.import_module(f"maxtext.{name}")


def _start(binary: str) -> None:
  # First the allocator, as a binary run as the main module does (it
  # re-executes the process under mimalloc: maxtext.common.host_memory).
  host_memory.keep_freed_memory(reexec=True)
  alias_bundled_packages()
  importlib.import_module(f"maxtext.bin.{binary}").console_main()


# The scripts' entry points (`pyproject.toml` [project.scripts]).
train = functools.partial(_start, "train")
sft = functools.partial(_start, "sft")
grpo = functools.partial(_start, "grpo")
distill = functools.partial(_start, "distill")
convert_ckpt = functools.partial(_start, "convert_ckpt")
aot_compile = functools.partial(_start, "aot_compile")
decode = functools.partial(_start, "decode")
eval = functools.partial(_start, "eval")  # pylint: disable=redefined-builtin
