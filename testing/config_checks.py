"""Checks every front door's config makes: each float field refuses NaN and
infinities, each path field resolves as the user meant it.

`assert_front_door(test, build, config, sections)` runs both on one front
door: `build(config)` builds the typed config from a ConfigDict (e.g.
`ExperimentConfig.from_config_dict`), `sections` maps its section names to
their dataclasses; the fields are found by their annotations and
`paths.field` markers, so a field added later is checked too.
"""

from collections.abc import Callable, Mapping
import dataclasses
import os
import typing
from typing import Any
from unittest import mock

from maxtext.common import paths


def _is_float(annotation: Any) -> bool:
  return annotation is float or float in typing.get_args(annotation)


def float_keys(config: Mapping[str, Any],
               sections: Mapping[str, type[Any]]) -> list[str]:
  """"section.key" of every float field of `sections` in `config`."""
  return [f"{name}.{key}" for name, cls in sections.items() if name in config
          for key, hint in typing.get_type_hints(cls).items()
          if key in config[name] and _is_float(hint)]


def path_keys(config: Mapping[str, Any],
              sections: Mapping[str, type[Any]]) -> list[str]:
  """"section.key" of every str path field of `sections` in `config`."""
  return [f"{name}.{f.name}" for name, cls in sections.items()
          if name in config for f in dataclasses.fields(cls)
          if paths.is_user_path(f) and isinstance(config[name].get(f.name),
                                                  str)]


def _set(config, key: str, value: Any) -> None:
  section, name = key.split(".")
  config[section][name] = value


def _get(built, key: str) -> Any:
  section, name = key.split(".")
  return getattr(getattr(built, section), name)


def assert_front_door(test, build: Callable[[Any], Any], config,
                      sections: Mapping[str, type[Any]]) -> None:
  """Asserts every float field of `config` refuses NaN and +-inf naming
  itself, and every path field, set relative, builds resolved against
  $BUILD_WORKING_DIRECTORY while `config` keeps what was typed."""
  floats = float_keys(config, sections)
  test.assertNotEmpty(floats)
  for key in floats:
    for bad in (float("nan"), float("inf"), float("-inf")):
      broken = config.copy_and_resolve_references()
      _set(broken, key, bad)
      with test.assertRaisesRegex(
          ValueError, rf"^{key}={bad!r} must be a finite number\.$"):
        build(broken)
  keys = path_keys(config, sections)
  test.assertNotEmpty(keys)
  typed = config.copy_and_resolve_references()
  for key in keys:
    _set(typed, key, f"rel/{key}.file")
  user_dir = "/home/user/project"
  with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": user_dir}):
    built = build(typed)
  for key in keys:
    test.assertEqual(_get(built, key),
                     os.path.join(user_dir, "rel", f"{key}.file"), key)
    section, name = key.split(".")
    test.assertEqual(typed[section][name], f"rel/{key}.file")
