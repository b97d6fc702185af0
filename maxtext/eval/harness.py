"""Runs lm-eval tasks: the ones that ship with maxtext, and your own.

Tasks are lm-eval task YAML files. The bundled ones (`BUNDLED_TASKS`, in
`maxtext/eval/tasks/<task>/`) are small local JSONL tasks: a multiple-choice
one scored by log-likelihood and a generation one scored by exact match.
Folders given as `include_paths` are searched for more YAML files (a task
over local files: `dataset_path: json` with `dataset_kwargs.data_files`).
lm-eval's own tasks are indexed only with `builtin_tasks=True`; most of them
download their data from the Hugging Face Hub.
"""

from collections.abc import Sequence
import os
from typing import Any

import lm_eval
from lm_eval import utils as lm_eval_utils
from lm_eval.api import model as lm_model
from lm_eval.tasks import TaskManager

BUNDLED_TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 "tasks")
BUNDLED_TASKS = ("maxtext_capitals", "maxtext_arithmetic")


def task_manager(include_paths: Sequence[str] = (), *,
                 builtin_tasks: bool = False) -> TaskManager:
  """Indexes the bundled tasks, those under `include_paths`, and lm-eval's
  own with `builtin_tasks`.

  Raises:
    FileNotFoundError: an include path is not a folder (names it).
  """
  for path in include_paths:
    if not os.path.isdir(path):
      raise FileNotFoundError(f"Task folder {path!r} does not exist.")
  return TaskManager(include_path=[BUNDLED_TASKS_DIR, *include_paths],
                     include_defaults=builtin_tasks)


def evaluate(lm: lm_model.LM, tasks: Sequence[str], *,
             include_paths: Sequence[str] = (), builtin_tasks: bool = False,
             limit: int | None = None, num_fewshot: int | None = None,
             log_samples: bool = False, seed: int = 0,
             apply_chat_template: bool = False) -> dict[str, Any]:
  """Scores `lm` on `tasks` (names of tasks or groups); lm-eval's results.

  Args:
    lm: The model, e.g. `lm_eval_adapter.MaxTextLM`.
    tasks: Task names.
    include_paths: More folders of task YAML files.
    builtin_tasks: Also index lm-eval's own tasks.
    limit: At most this many documents per task.
    num_fewshot: Overrides the tasks' number of few-shot examples.
    log_samples: Keep every request and response under "samples".
    seed: Seed of the few-shot sampling and of Python's and numpy's RNGs.
    apply_chat_template: Render each request as a conversation with the
      model's chat template (`lm.apply_chat_template`).

  Raises:
    ValueError: a task is unknown (names it and the known ones).
  """
  manager = task_manager(include_paths, builtin_tasks=builtin_tasks)
  unknown = [name for name in tasks if name not in manager.all_tasks]
  if unknown:
    known = manager.all_tasks
    raise ValueError(f"Unknown task(s) {unknown}; known: {known[:50]}"
                     f"{' ...' if len(known) > 50 else ''}.")
  return lm_eval.simple_evaluate(
      model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
      num_fewshot=num_fewshot, log_samples=log_samples, random_seed=seed,
      numpy_random_seed=seed, torch_random_seed=None,
      fewshot_random_seed=seed, apply_chat_template=apply_chat_template)


def scores(results: dict[str, Any]) -> dict[str, dict[str, float]]:
  """{task: {metric: value}} of lm-eval's results (the "metric,filter"
  keys, standard errors left out)."""
  out = {}
  for task, metrics in results["results"].items():
    out[task] = {key: float(value) for key, value in metrics.items()
                 if "," in key and "_stderr" not in key and
                 isinstance(value, (int, float))}
  return out


def table(results: dict[str, Any]) -> str:
  """lm-eval's Markdown table of the results."""
  return lm_eval_utils.make_table(results)
