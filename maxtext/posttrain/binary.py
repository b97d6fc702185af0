"""The post-training binaries' `main` (sft, distill, grpo): their common
flags, the workdir and compilation cache, the run in one-line errors, and a
preempted run's exit code.
"""

from collections.abc import Callable
import dataclasses
import sys
from typing import Any

from absl import app
from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags

from maxtext.common import cli
from maxtext.common import compilation_cache
from maxtext.common import config_flag
from maxtext.common import paths
from maxtext.common import workdir as workdir_lib
from maxtext.trainers import preemption


@dataclasses.dataclass(frozen=True)
class BinaryFlags:
  """The flags every post-training binary has: --config, --load, --workdir,
  --compilation_cache_dir."""

  config: Any
  load: flags.FlagHolder
  workdir: flags.FlagHolder
  compilation_cache_dir: flags.FlagHolder


def define_binary_flags(*, config_help: str, load_help: str,
                        default_workdir: str) -> BinaryFlags:
  """Defines --config (a config file, variants and --config.<section>.<key>
  overrides; `config_help` says which), --load, --workdir and
  --compilation_cache_dir (`compilation_cache`)."""
  return BinaryFlags(
      config=config_flag.define_config_file(
          "config", f"{config_help}; override fields with"
          " --config.<section>.<key>=<value>."),
      load=flags.DEFINE_string("load", None, load_help),
      workdir=flags.DEFINE_string(
          "workdir", None, f"Output directory; default {default_workdir}"
          " under the directory you run from."),
      compilation_cache_dir=compilation_cache.define_flag())


def binary_main(program: str, run: Callable[[ml_collections.ConfigDict, str],
                                            Any],
                defined: BinaryFlags,
                before_run: Callable[[ml_collections.ConfigDict], None]
                | None = None) -> Callable[[list[str]], None]:
  """The `main(argv)` of binary `program`: `before_run(config)` (the
  binary's own flags into a copy of the config), then `run_binary`."""
  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = defined.config.value.copy_and_resolve_references()
    if before_run is not None:
      before_run(config)
    run_binary(
        program, run, config,
        config_path=config_flags.get_config_filename(flags.FLAGS["config"]),
        load=defined.load.value, workdir=defined.workdir.value,
        compilation_cache_dir=defined.compilation_cache_dir.value)

  return main


def start_binary(main: Callable[[list[str]], None]) -> None:
  """Runs `main` as a binary whose --config is required and whose paths are
  the user's (`paths.resolve_config_argv`)."""
  flags.mark_flag_as_required("config")
  sys.argv = paths.resolve_config_argv(sys.argv)
  app.run(main)


def run_binary(program: str, run: Callable[[ml_collections.ConfigDict, str],
                                           Any],
               config: ml_collections.ConfigDict, *, config_path: str,
               load: str | None, workdir: str | None,
               compilation_cache_dir: str | None) -> Any:
  """What the post-training binaries' `main` does: `--load` into the
  config, the workdir chosen, JAX's persistent compilation cache set
  (`compilation_cache.use`), then `run(config, workdir)` with errors in one
  line from `program` (`cli.errors_in_one_line`). The paths the user typed
  are resolved when the config's sections are built
  (`maxtext.common.sections`)."""
  if load:
    config.train.load = load
  workdir = workdir_lib.resolve_workdir(workdir, config_path)
  cache = compilation_cache.use(compilation_cache_dir, workdir)
  logging.info("%d devices (%s); config %s, workdir %s, compilation cache %s.",
               jax.device_count(), jax.devices()[0].device_kind, config_path,
               workdir, cache or "off")
  with cli.errors_in_one_line(program), workdir_lib.exclusive(
      workdir, take=jax.process_index() == 0):
    result = run(config, workdir)
  if result.preempted:
    logging.warning("Stopped after update %d; its checkpoint is in %s. Run"
                    " the same command to resume.",
                    result.trainer.train_steps, workdir)
    raise SystemExit(preemption.EXIT_CODE_PREEMPTED)
  logging.info("Exported %s.", result.exported)
  return result
