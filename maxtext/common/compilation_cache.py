"""JAX's persistent compilation cache for the binaries that train.

A binary defines `--compilation_cache_dir` with `define_flag()` and calls
`use(flag value, workdir)` before it compiles anything. By default the cache
is the workdir's `compilation_cache` folder, so running the same command
again (a resumed run, a restart after preemption) loads its compiled
programs instead of compiling them; $JAX_COMPILATION_CACHE_DIR, when set,
is the default instead (a cache shared by several runs), and an empty flag
turns the cache off.
"""

import os

from absl import flags
import jax

from maxtext.common import paths

DIRNAME = "compilation_cache"


def define_flag() -> flags.FlagHolder:
  """Defines --compilation_cache_dir (the value `use` takes)."""
  return flags.DEFINE_string(
      "compilation_cache_dir", None,
      "JAX's persistent compilation cache: a run (or a resumed run) whose"
      " programs are in it loads them instead of compiling. Default: the"
      f" workdir's {DIRNAME} folder, or $JAX_COMPILATION_CACHE_DIR when set;"
      " empty: off.")


def use(flag_value: str | None, workdir: str) -> str:
  """Points JAX's persistent compilation cache at `flag_value` (None: the
  workdir's `compilation_cache`, unless $JAX_COMPILATION_CACHE_DIR is set;
  empty: no cache); returns the folder in use (absolute; "" for none)."""
  if flag_value is None:
    flag_value = (os.environ.get("JAX_COMPILATION_CACHE_DIR") or
                  os.path.join(workdir, DIRNAME))
  if not flag_value:
    return ""
  path = paths.user_path(flag_value)
  jax.config.update("jax_compilation_cache_dir", path)
  # Every program of the run, not only those above JAX's 1 s default.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  return path
