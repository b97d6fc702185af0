"""Paths a user typed, resolved against the directory they ran from.

Under `bazel run` a binary starts in its runfiles folder, and Bazel names the
directory the user ran the command from in `BUILD_WORKING_DIRECTORY`; a path
the user typed (a flag, or a config value such as `data.files`) means a path
there. Outside Bazel that directory is the current one.

Config values are resolved once, at the boundary where a config section
becomes its typed dataclass (`maxtext.common.sections.build_section`): a
dataclass field that holds a user's path says so with `paths.field`, e.g.

  files: str = paths.field(paths.user_patterns)

and `resolve_values(cls, values)` returns the section's values with every
such field resolved; the `ConfigDict` is never modified.
"""

from collections.abc import Callable, Mapping
import dataclasses
import importlib.util
import os
from typing import Any

# The metadata key of a dataclass field that holds a user's path: its value
# is the function resolving the field's value (see `field`).
_RESOLVE = "maxtext_user_path"


def user_path(path: str) -> str:
  """`path` as the user meant it: relative paths resolve against the
  directory the command was run from (`BUILD_WORKING_DIRECTORY` under
  `bazel run`, else the current directory); "" stays "" (unset)."""
  if not path:
    return path
  path = os.path.expanduser(path)
  if os.path.isabs(path):
    return path
  base = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
  return os.path.normpath(os.path.join(base, path))


def user_patterns(value: str) -> str:
  """Comma-separated paths or glob patterns, each as `user_path` (blank
  entries dropped)."""
  return ",".join(user_path(p.strip()) for p in value.split(",")
                  if p.strip())


def field(resolve: Callable[[Any], Any] = user_path,
          **kwargs: Any) -> Any:
  """A dataclass field holding what a user typed as a path.

  Args:
    resolve: Turns the typed value into the resolved one (`user_path` for
      one path, `user_patterns` for a comma-separated list); called only on
      a set (truthy) value.
    **kwargs: `dataclasses.field`'s (a default, ...).
  """
  return dataclasses.field(metadata={_RESOLVE: resolve}, **kwargs)


def is_user_path(f: dataclasses.Field) -> bool:
  """Whether dataclass field `f` holds a user's path (made with `field`)."""
  return _RESOLVE in f.metadata


def resolve_values(cls: type[Any], values: Mapping[str, Any]
                   ) -> dict[str, Any]:
  """`values` of dataclass `cls` with each `field`-marked path resolved."""
  out = dict(values)
  for f in dataclasses.fields(cls):
    resolve = f.metadata.get(_RESOLVE)
    if resolve is not None and out.get(f.name):
      out[f.name] = resolve(out[f.name])
  return out


def config_file_path(path: str) -> str:
  """Where to read a `--config` file from (the `:arg` suffix kept).

  A bare name (`gemma3`, `gemma3:small`) is a bundled config: `configs/`
  under Bazel, `maxtext/configs/` of the pip install. Under `bazel run` the
  current directory holds the runfiles, where the bundled configs
  (`configs/gemma3.py`) are; a path that is not there is resolved against
  the directory the user ran from.
  """
  file_path, sep, arg = path.partition(":")
  if file_path.isidentifier():
    bundled = _bundled_config(file_path)
    if bundled:
      return bundled + sep + arg
  if os.path.isabs(file_path) or os.path.exists(file_path):
    return path
  return user_path(file_path) + sep + arg


def _bundled_config(name: str) -> str | None:
  """The path of bundled config `name`, or None when there is none."""
  for package in ("maxtext.configs", "configs"):
    try:
      spec = importlib.util.find_spec(package)
    except ImportError:
      continue
    for folder in (spec.submodule_search_locations or []) if spec else []:
      candidate = os.path.join(folder, f"{name}.py")
      if os.path.isfile(candidate):
        return candidate
  return None


def resolve_config_argv(argv: list[str], flag: str = "config") -> list[str]:
  """`argv` with the value of `--<flag>` passed through `config_file_path`.

  Overrides (`--config.train.steps=10`) are left alone.
  """
  out = list(argv)
  for i, arg in enumerate(out):
    for prefix in (f"--{flag}=", f"-{flag}="):
      if arg.startswith(prefix):
        out[i] = prefix + config_file_path(arg[len(prefix):])
    if arg in (f"--{flag}", f"-{flag}") and i + 1 < len(out):
      out[i + 1] = config_file_path(out[i + 1])
  return out
