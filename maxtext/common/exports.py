"""Export folders: written whole or not at all, never over what is not ours.

`with exports.writing(target, sources=(input,)) as folder:` yields a
temporary sibling of `target` to write into. When the block ends it renames
that folder to `target` (an earlier export there is removed only once the
new one is complete); when the block raises, it removes the temporary folder
and `target` is as it was. Before anything is written it refuses (one
`ExportTargetError` naming the folder):

- a target that is, holds or lies inside one of `sources` (an export that
  would overwrite its own input);
- a target that is a training workdir, or lies inside one;
- a target holding anything but an earlier export of ours (marked with
  `MARKER`), unless the caller owns it (`owned=True`: the folders a
  post-training run exports into its own workdir).
"""

from collections.abc import Iterator, Sequence
import contextlib
import json
import os
import shutil
import tempfile

from maxtext.common import workdir as workdir_lib

# Written into every finished export; its presence makes a folder ours.
MARKER = ".maxtext-export"


class ExportTargetError(ValueError):
  """An export may not write to the folder; the message names it."""


def _within(path: str, folder: str) -> bool:
  return os.path.commonpath([path, folder]) == folder


def _workdir_of(path: str) -> str | None:
  """The training workdir `path` is or lies in, if any."""
  while True:
    if (os.path.isfile(os.path.join(path, workdir_lib.CONFIG_FILENAME)) and
        (os.path.isdir(os.path.join(path, workdir_lib.CHECKPOINT_DIRNAME)) or
         os.path.exists(os.path.join(path, workdir_lib.LOCK_FILENAME)))):
      return path
    parent = os.path.dirname(path)
    if parent == path:
      return None
    path = parent


def check_target(target: str, *, sources: Sequence[str] = (),
                 owned: bool = False) -> str:
  """The absolute target, after the checks of the module docstring.

  Raises:
    ExportTargetError: the target may not receive the export.
  """
  target = os.path.realpath(os.path.abspath(target))
  for source in sources:
    source = os.path.realpath(os.path.abspath(source))
    if _within(target, source) or _within(source, target):
      raise ExportTargetError(
          f"The export to {target} would overwrite its own input {source};"
          " choose another output folder.")
  if not owned:
    workdir = _workdir_of(target)
    if workdir is not None:
      raise ExportTargetError(
          f"{target} is in the training workdir {workdir}; an export may"
          " not write there: choose a new or empty folder.")
  if os.path.exists(target) and not os.path.isdir(target):
    raise ExportTargetError(f"{target} is a file; choose a folder.")
  if os.path.isdir(target) and not owned:
    names = sorted(os.listdir(target))
    if names and MARKER not in names:
      listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
      raise ExportTargetError(
          f"{target} holds files that are not an earlier export ({listed});"
          " choose a new or empty folder, or remove them.")
  return target


@contextlib.contextmanager
def writing(target: str, *, sources: Sequence[str] = (), kind: str,
            owned: bool = False) -> Iterator[str]:
  """A temporary folder that becomes `target` when the block succeeds.

  Args:
    target: The export folder.
    sources: What the export reads (checked against `target`).
    kind: What it is ("hf", "converted", ...), recorded in `MARKER`.
    owned: The caller owns `target` (see the module docstring).

  Raises:
    ExportTargetError: from `check_target`, before anything is written.
  """
  target = check_target(target, sources=sources, owned=owned)
  parent = os.path.dirname(target)
  os.makedirs(parent, exist_ok=True)
  name = os.path.basename(target)
  folder = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(folder, 0o777 & ~umask)  # As a plain mkdir would make it.
  try:
    yield folder
    with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
      json.dump({"kind": kind, "sources": list(sources)}, f)
      f.write("\n")
    if os.path.exists(target):
      old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
      os.rename(target, os.path.join(old, name))
      os.rename(folder, target)
      shutil.rmtree(old)
    else:
      os.rename(folder, target)
  except BaseException:
    shutil.rmtree(folder, ignore_errors=True)
    raise
