"""Reading a JSON object from a file that may be damaged.

`read_object(path)` returns the object, or raises `JsonFileError` (a
`ValueError`) whose message names the file and says what is wrong with it:
missing, unreadable (a folder, a dangling link, no permission), not UTF-8,
not JSON (empty, truncated), nested too deeply, or not an object.
"""

import json
import os
from typing import Any


class JsonFileError(ValueError):
  """A JSON file is missing or damaged; the message names it."""


def read_object(path: str) -> dict[str, Any]:
  """The JSON object in file `path`.

  Raises:
    JsonFileError: as the module docstring says.
  """
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except FileNotFoundError:
    problem = ("is a dangling link" if os.path.islink(path) else
               "does not exist")
    raise JsonFileError(f"{path} {problem}.") from None
  except OSError as e:
    raise JsonFileError(f"{path} cannot be read: {e.strerror or e}.") from e
  except UnicodeDecodeError as e:
    raise JsonFileError(f"{path} is not UTF-8 text: {e}.") from e
  except json.JSONDecodeError as e:
    raise JsonFileError(f"{path} is not valid JSON (empty or cut short?):"
                        f" {e}.") from e
  except RecursionError as e:
    raise JsonFileError(f"{path} is nested too deeply.") from e
  if not isinstance(value, dict):
    raise JsonFileError(f"{path} holds a JSON {type(value).__name__}, not an"
                        " object.")
  return value
