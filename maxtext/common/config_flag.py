"""The `--config` flag of the binaries, with one-line errors for bad overrides.

`ml_collections.config_flags` resolves `--config.<section>.<key>=<value>`
overrides while absl parses the flags, but a misspelt key escapes as a raw
`AttributeError`/`KeyError` traceback instead of absl's one-line
`FATAL Flags parsing error: ...`. `define_config_file` defines the same flag
and turns those errors into `flags.IllegalFlagValueError`, which `app.run`
reports like any other bad flag:

  FATAL Flags parsing error: --config.optimizer.learnin_rate: unknown config
  field 'learnin_rate'. Did you mean "learning_rate" instead of ...?
"""

import sys

from absl import flags
from ml_collections import config_flags

from maxtext.common import model_config
from maxtext.common import sections


def _innermost_message(error: BaseException) -> str:
  """The text of `error`, unwrapping `AttributeError(KeyError(text))`."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  return str(error.args[0]) if error.args else str(error)


def override_error_message(name: str, error: BaseException,
                           argv: list[str]) -> str:
  """One line naming the override of `--<name>` that `error` rejected.

  Args:
    name: The config flag's name.
    error: What `ml_collections` raised for an unknown field.
    argv: The command line, to find the override naming the field.
  """
  first, _, rest = _innermost_message(error).partition("\n")
  field = first.strip("'\"")
  override = f"--{name}"
  for arg in argv:
    path = arg.lstrip("-").partition("=")[0]
    if path.startswith(f"{name}.") and field in path.split(".")[1:]:
      override = "--" + path
      break
  section, _, key = override.removeprefix(f"--{name}.").partition(".")
  if section == "model":
    try:
      sections.check_moved(section, model_config.ModelConfig, [key])
    except ValueError as moved:
      return f"{override}: {moved}"
  hint = f" {rest.strip()}" if rest.strip() else ""
  return f"{override}: unknown config field {field!r}.{hint}"


def define_config_file(
    name: str, help_string: str, *,
    flag_values: flags.FlagValues = flags.FLAGS,
    sys_argv: list[str] | None = None) -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file(name)`, bad overrides as flag errors.

  Args:
    name: The flag's name (`config`).
    help_string: Its help.
    flag_values: Where to register it.
    sys_argv: The command line the overrides are read from (default
      `sys.argv`); for tests.

  Returns:
    The flag holder; `.value` is the `ConfigDict` with overrides applied.
  """
  holder = config_flags.DEFINE_config_file(
      name, None, help_string, flag_values=flag_values, sys_argv=sys_argv)
  flag = flag_values[name]
  parse = flag.parse

  def parse_naming_bad_overrides(argument):
    try:
      parse(argument)
    except (AttributeError, KeyError) as e:  # ml_collections: unknown field.
      raise flags.IllegalFlagValueError(override_error_message(
          name, e, sys.argv if sys_argv is None else sys_argv)) from e

  flag.parse = parse_naming_bad_overrides
  return holder
