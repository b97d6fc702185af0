"""Reading a JSON object from a file that may be damaged.

`read_object(path)` returns the object, or raises `JsonFileError` (a
`ValueError`) whose message names the file and says what is wrong with it:
missing, unreadable (a folder, a dangling link, no permission), not a
regular file (a device, a pipe: never opened, as reading one may never end),
not UTF-8, not JSON (empty, truncated, a number too long), nested too
deeply, or not an object.
"""

import json
import os
import stat
from typing import Any


class JsonFileError(ValueError):
  """A JSON file is missing or damaged; the message names it."""


def read_object(path: str, *, name: str | None = None) -> dict[str, Any]:
  """The JSON object in file `path`.

  Args:
    path: The file.
    name: How messages name it (default: `path`).

  Raises:
    JsonFileError: as the module docstring says.
  """
  name = path if name is None else name
  try:
    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
      raise JsonFileError(f"{name} is not a regular file (a device, pipe or"
                          " socket).")
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except FileNotFoundError:
    problem = ("is a dangling link" if os.path.islink(path) else
               "does not exist")
    raise JsonFileError(f"{name} {problem}.") from None
  except OSError as e:
    raise JsonFileError(f"{name} cannot be read: {e.strerror or e}.") from e
  except UnicodeDecodeError as e:
    raise JsonFileError(f"{name} is not UTF-8 text: {e}.") from e
  except json.JSONDecodeError as e:
    raise JsonFileError(f"{name} is not valid JSON (empty or cut short?):"
                        f" {e}.") from e
  except JsonFileError:
    raise
  except ValueError as e:  # An integer literal over Python's digit limit.
    raise JsonFileError(f"{name} is not valid JSON: {e}.") from e
  except RecursionError as e:
    raise JsonFileError(f"{name} is nested too deeply.") from e
  if not isinstance(value, dict):
    raise JsonFileError(f"{name} holds a JSON {type(value).__name__}, not an"
                        " object.")
  return value
