"""The config front door: a ConfigDict's sections become typed dataclasses.

Every binary's config (pre-training, post-training, RL) is sections of plain
values (`configs/<family>.py` after command-line overrides); each section is
a frozen dataclass defined next to the code that reads it and validated in
its `__post_init__`. `build_sections(config, SECTIONS)` builds them all:

- an unknown section or key is an error that names it, suggests the closest
  valid one and lists them all (a key the section's `MOVED_KEYS` lists is
  named with where it went); a missing one is named;
- a value of the wrong plain type (bool, int, float, str) is named with the
  type it needs, and a float that is NaN or infinite is refused, for every
  float field of every section;
- the paths a user typed (fields made with `maxtext.common.paths.field`)
  are resolved against the directory the command ran from;

and the ConfigDict is left as it was. The sections' own checks use the
validators below (`check_int`, `check_float`, `check_choice`,
`check_bool`), which all raise `ValueError("<section>.<key>=<value> ...")`.
"""

from collections.abc import Iterable, Mapping
import dataclasses
import difflib
import math
import types
import typing
from typing import Any

from maxtext.common import paths


def _did_you_mean(unknown: Iterable[str], valid: list[str],
                  prefix: str) -> str:
  """` (did you mean 'x'?)` for the unknown names close to a valid one."""
  guesses = []
  for name in unknown:
    close = difflib.get_close_matches(name, valid, n=1)
    if close:
      guesses.append(f"'{prefix}{close[0]}'")
  return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


def _plain_types(annotation: Any) -> tuple[Any, ...]:
  """The plain types an annotation allows (`float | None` -> (float,
  NoneType)); () for anything else (left to the section's checks)."""
  if isinstance(annotation, types.UnionType) or (
      typing.get_origin(annotation) is typing.Union):
    return typing.get_args(annotation)
  return (annotation,)


def _fits(value: Any, expected: Any) -> bool | None:
  """Whether `value` fits the plain type `expected`; None when `expected`
  is not one of bool, int, float, str, None."""
  if expected is type(None):
    return value is None
  if expected is bool:
    return isinstance(value, bool)
  if expected is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if expected is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if expected is str:
    return isinstance(value, str)
  return None


def _type_error(key: str, value: Any, annotation: Any) -> str | None:
  """Why `value` does not fit `annotation`, or None if it does.

  Plain types (bool, int, float, str, optionally `| None`) are checked; an
  int is a valid float, a NaN or infinite float is not. Other annotations
  are left to the section's own validation.
  """
  allowed = _plain_types(annotation)
  fits = [_fits(value, t) for t in allowed]
  if None in fits:
    return None
  if not any(fits):
    names = " or ".join("None" if t is type(None) else t.__name__
                        for t in allowed)
    return (f"{key}={value!r} is a {type(value).__name__}; it must be a"
            f" {names}.")
  return _finite_error(key, value)


def _finite_error(key: str, value: Any) -> str | None:
  """Why `value` is not a finite float, or None if it is or is no float."""
  if isinstance(value, float) and not math.isfinite(value):
    return f"{key}={value!r} must be a finite number."
  return None


def check_finite(name: str, values: Mapping[str, Any]) -> None:
  """No float of `values` (keys of section `name`) is NaN or infinite.

  Raises:
    ValueError: naming the first such key and its value.
  """
  for key, value in values.items():
    error = _finite_error(f"{name}.{key}", value)
    if error:
      raise ValueError(error)


def check_moved(name: str, cls: type[Any], keys: Iterable[str]) -> None:
  """Refuses a key of section `name` that its class lists as moved
  (`cls.MOVED_KEYS`: old key -> "section.key" now).

  Raises:
    ValueError: one line naming the old key and the new one.
  """
  moved = getattr(cls, "MOVED_KEYS", {})
  for key in keys:
    if key in moved:
      raise ValueError(f"Config key '{name}.{key}' moved to '{moved[key]}';"
                       f" set --config.{moved[key]} instead.")


def build_section(name: str, cls: type[Any], values: Mapping[str, Any]) -> Any:
  """`cls(**values)`, naming unknown, missing or mistyped keys of `name`,
  with the user's paths resolved (`paths.resolve_values`).

  Raises:
    ValueError: a key is unknown (the message suggests the closest valid one
      and lists them all), missing, or of the wrong type (names the key, the
      value and the type it must have), or the section's own check fails.
  """
  if hasattr(values, "to_dict"):
    values = values.to_dict()
  if not isinstance(values, Mapping):
    raise ValueError(f"Config section '{name}' must be a mapping of keys to"
                     f" values, not {values!r}.")
  schema = _schema(cls)
  fields = list(schema)
  unknown = sorted(set(values) - set(fields))
  check_moved(name, cls, unknown)
  if unknown:
    keys = ", ".join(f"'{name}.{key}'" for key in unknown)
    raise ValueError(
        f"Unknown config key {keys}{_did_you_mean(unknown, fields, name + '.')}"
        f"; valid keys of '{name}': {fields}.")
  missing = [key for key, (_, required) in schema.items()
             if required and key not in values]
  if missing:
    keys = ", ".join(f"'{name}.{key}'" for key in missing)
    raise ValueError(f"Missing config key {keys}; set it in the config file.")
  for key, value in values.items():
    error = _type_error(f"{name}.{key}", value, schema[key][0])
    if error:
      raise ValueError(error)
  if hasattr(cls, "section_schema"):
    return cls.from_dict(values)
  return cls(**paths.resolve_values(cls, values))


def _schema(cls: type[Any]) -> dict[str, tuple[Any, bool]]:
  """{key: (its type, whether required)} of a section's dataclass, or the
  class's own `section_schema()` (a section whose keys are not its fields,
  as the flat `model` section of `ModelConfig`, built by `from_dict`)."""
  if hasattr(cls, "section_schema"):
    return cls.section_schema()
  hints = typing.get_type_hints(cls)
  return {f.name: (hints.get(f.name), f.default is dataclasses.MISSING and
                   f.default_factory is dataclasses.MISSING)
          for f in dataclasses.fields(cls)}


def build_sections(config: Mapping[str, Any],
                   sections: Mapping[str, type[Any]], *,
                   optional: Iterable[str] = ()) -> dict[str, Any]:
  """Every section of `sections` built from `config` (`build_section`).

  Args:
    config: The config's sections (a ConfigDict or a mapping).
    sections: Section name -> its dataclass, each required.
    optional: Section names `config` may also have; the caller builds them
      (their presence decides something, as RL's `model`).

  Raises:
    ValueError: a section is unknown (with the closest valid name) or
      missing, or a key or value of one is bad.
  """
  if hasattr(config, "to_dict"):
    config = config.to_dict()
  valid = [*sections, *optional]
  unknown = sorted(set(config) - set(valid))
  missing = [name for name in sections if name not in config]
  problems = []
  if unknown:
    problems.append(f"Unknown config section(s) {unknown}"
                    f"{_did_you_mean(unknown, valid, '')}")
  if missing:
    problems.append(f"{'m' if unknown else 'M'}issing config section(s)"
                    f" {missing}")
  if problems:
    raise ValueError(f"{'; '.join(problems)}; valid sections: {valid}.")
  return {name: build_section(name, cls, config[name])
          for name, cls in sections.items()}


def check_int(key: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None) -> None:
  """`value` is an int (not a bool) in [minimum, maximum] (None: unbounded).

  Raises:
    ValueError: naming `key` (e.g. "train.steps"), the value and the range.
  """
  if (isinstance(value, bool) or not isinstance(value, int) or
      (minimum is not None and value < minimum) or
      (maximum is not None and value > maximum)):
    what = _range("an integer", minimum, maximum)
    raise ValueError(f"{key}={value!r} must be {what}.")


def check_float(key: str, value: Any, *, minimum: float | None = None,
                maximum: float | None = None,
                above: float | None = None) -> None:
  """`value` is a finite number, >= minimum, <= maximum and > above.

  Raises:
    ValueError: naming `key`, the value and what it must be.
  """
  ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and
        math.isfinite(value) and
        (minimum is None or value >= minimum) and
        (maximum is None or value <= maximum) and
        (above is None or value > above))
  if not ok:
    what = _range("a finite number", minimum, maximum)
    if above is not None:
      what += f" > {above}"
    raise ValueError(f"{key}={value!r} must be {what}.")


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> None:
  """`value` is one of `choices`.

  Raises:
    ValueError: naming `key`, the value and the valid choices.
  """
  choices = tuple(choices)
  if value not in choices:
    raise ValueError(f"{key}={value!r} is invalid; valid values: {choices}.")


def check_bool(key: str, value: Any) -> None:
  """`value` is True or False.

  Raises:
    ValueError: naming `key` and the value.
  """
  if not isinstance(value, bool):
    raise ValueError(f"{key}={value!r} must be True or False.")


def fail_part(part: Any, field: str, valid: str) -> None:
  """Raises the error of field `field` of `part`, a part of the `model`
  section (`maxtext.common.model_config`), naming the key a user sets
  (`part.KEYS[field]`): "ModelConfig.<key>=<value> is invalid: <valid>."."""
  key = type(part).KEYS[field]
  raise ValueError(f"ModelConfig.{key}={getattr(part, field)!r} is invalid:"
                   f" {valid}.")


def _range(kind: str, minimum: Any, maximum: Any) -> str:
  if minimum is not None and maximum is not None:
    return f"{kind} in [{minimum}, {maximum}]"
  if minimum is not None:
    return f"{kind} >= {minimum}"
  if maximum is not None:
    return f"{kind} <= {maximum}"
  return kind
