"""The run's working directory: where it is, and the config written into it.

Layout of a workdir:
  .lock              held by the run using the workdir (`exclusive`)
  config.json        the resolved config of the first run (written once)
  config_step<N>.json  a changed config of a run resumed at update N
  metrics.jsonl      one line of metrics per logged update
  tensorboard/       TensorBoard event files
  checkpoints/<N>/   Orbax checkpoints after N updates (the persistent tier)
  <checkpoint.local_dir>/<N>/  the local tier, when configured
  profile/           jax.profiler traces
"""

from collections.abc import Iterator
import contextlib
import fcntl
import json
import os
import re
import socket
import time
from typing import Any

from absl import logging

from maxtext.common import json_file
from maxtext.common import paths

LOCK_FILENAME = ".lock"
CONFIG_FILENAME = "config.json"
CHECKPOINT_DIRNAME = "checkpoints"
PROFILE_DIRNAME = "profile"


def output_path(workdir: str, path: str, *, key: str) -> str:
  """Where the config value `key` = `path` makes the run write: in `workdir`.

  A config file may come from elsewhere; the folders it names for writing are
  therefore relative to the workdir and must stay inside it. The check is on
  the path as written (`..` resolved, symlinks not followed), so a symlink
  that whoever runs the job put in the workdir may lead elsewhere (e.g. to a
  RAM disk).

  Raises:
    ValueError: `path` is empty, absolute, or leaves the workdir; the message
      names the key, the value and the workdir.
  """
  workdir = os.path.normpath(os.path.abspath(workdir))
  resolved = os.path.normpath(os.path.join(workdir, path))
  if (not path or os.path.isabs(path) or path.startswith("~") or
      os.path.commonpath([workdir, resolved]) != workdir or
      resolved == workdir):
    raise ValueError(
        f"{key}={path!r} must name a folder inside the workdir {workdir}"
        " (relative, without leaving it); to write elsewhere, make a"
        " symlink inside the workdir and name that.")
  return resolved


def default_workdir(config_path: str) -> str:
  """`runs/<config file stem>[_<arg>]` under the directory the user ran from.

  Example: `configs/gemma3.py:1b` -> `<cwd>/runs/gemma3_1b`.
  """
  file_path, _, arg = config_path.partition(":")
  name = os.path.splitext(os.path.basename(file_path))[0]
  if arg:
    name += "_" + "".join(c if c.isalnum() or c in "-." else "_" for c in arg)
  return paths.user_path(os.path.join("runs", name))


def resolve_workdir(workdir_flag: str | None, config_path: str) -> str:
  """A binary's --workdir (relative to the directory the user ran from), or
  `default_workdir(config_path)` when it is not given."""
  return (paths.user_path(workdir_flag) if workdir_flag else
          default_workdir(config_path))


class WorkdirBusyError(OSError):
  """Another run holds the workdir."""


@contextlib.contextmanager
def exclusive(workdir: str, *, take: bool = True) -> Iterator[None]:
  """Holds `workdir` for one run while inside: a second run on it fails at
  once instead of saving the same steps and interleaving the metrics.

  The lock is `flock` on `<workdir>/.lock`, so the kernel releases it when
  the holding process ends, however it ends (a killed run never blocks the
  next); the file names the holder for the error. A run of several
  processes takes it on one (`take=False` on the others).

  Raises:
    WorkdirBusyError: another process holds it (the message names its pid,
      host and start time).
    OSError: the workdir cannot be created (e.g. it is a file).
  """
  if not take:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILENAME)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
      raise WorkdirBusyError(
          f"Workdir {workdir} is in use by another run ({holder or 'unknown'}"
          "); wait for it to end, or choose another --workdir.") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, (f"pid {os.getpid()} on {socket.gethostname()}, since "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n").encode(), 0)
    yield
  finally:
    os.close(fd)  # Releases the lock.


def write_config(workdir: str, config: dict[str, Any], *, step: int) -> str:
  """Writes the resolved config to the workdir once; returns its path.

  The first run writes `config.json`. A resumed run whose config equals the
  one in effect at `step` (the latest earlier resume's, `step_config_path`)
  writes nothing; with a different one, even one equal to the first run's, it
  writes `config_step<step>.json` and logs the changed keys.

  Raises:
    ValueError: the config in effect cannot be read (names it).
  """
  os.makedirs(workdir, exist_ok=True)
  text = json.dumps(config, indent=2, default=str) + "\n"
  first = os.path.join(workdir, CONFIG_FILENAME)
  if not os.path.lexists(first):  # A dangling link is not replaced.
    _write_atomically(first, text)
    return first
  in_effect = step_config_path(workdir, step + 1)
  try:
    previous = json_file.read_object(in_effect)
  except json_file.JsonFileError as e:
    which = ("first run" if in_effect == first
             else f"run resumed at step {_resume_step(in_effect)}")
    raise ValueError(
        f"The config of this workdir's {which} cannot be read: {e} Restore"
        " it, or choose another --workdir (its checkpoints are left as they"
        " are).") from e
  current = json.loads(text)
  if previous == current:
    return in_effect
  changed = sorted(_diff(previous, current))
  path = os.path.join(workdir, f"config_step{step}.json")
  _write_atomically(path, text)
  logging.warning("Config differs from %s in %s; wrote %s.", in_effect,
                  changed, path)
  return path


def step_config_path(workdir: str, step: int) -> str:
  """The config file (`write_config`'s) of the run that saved the checkpoint
  of `step`: the `config_step<N>.json` of the latest resume before `step`
  (N < step), or `config.json`."""
  resumes = [_resume_step(name) for name in os.listdir(workdir)
             if re.fullmatch(r"config_step\d+\.json", name)]
  earlier = [n for n in resumes if n < step]
  return os.path.join(workdir, f"config_step{max(earlier)}.json"
                      if earlier else CONFIG_FILENAME)


def _resume_step(path: str) -> int:
  return int(os.path.basename(path)[len("config_step"):-len(".json")])


def _diff(a: Any, b: Any, prefix: str = "") -> set[str]:
  if isinstance(a, dict) and isinstance(b, dict):
    out = set()
    for key in set(a) | set(b):
      out |= _diff(a.get(key), b.get(key), f"{prefix}{key}.")
    return out
  return set() if a == b else {prefix.rstrip(".")}


def _write_atomically(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)
