r"""Scores a checkpoint on lm-eval tasks and measures its perplexity.

Loads a converted checkpoint (convert_ckpt), a training checkpoint
<workdir>/checkpoints/<step> or a workdir (its latest step) with its
tokenizer (override with --tokenizer), runs lm-eval tasks through our model
(log-likelihoods in batches, generation with a KV cache) and prints lm-eval's
table. The bundled tasks are maxtext_capitals (multiple choice),
maxtext_arithmetic (generation, exact match) and maxtext_word_problems (the
held-out set of the RL word problems, exact "#### N" answer; for a chat model
give --chat_template; maxtext_word_problems_easy: the easy split's); --include_path adds folders of your own task YAML
files. --chat_template renders each request as a conversation. --perplexity_data scores documents (text, JSONL,
Parquet, ... as in training data) in windows of --max_length tokens.
--output writes the scores as JSON (with --log_samples, also each request
and response).

Example:

  tools/bazel run //maxtext/bin:eval -- --checkpoint=ckpts/qwen3_0.6b \
      --tasks=maxtext_capitals,maxtext_arithmetic \
      --perplexity_data=/data/valid.jsonl
"""

from maxtext.common import host_memory
from maxtext.common import paths

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
import dataclasses
import json

from absl import app
from absl import flags
from absl import logging

from maxtext.common import cli
from maxtext.data import chat_template as chat_lib
from maxtext.eval import harness
from maxtext.eval import lm_eval_adapter
from maxtext.eval import perplexity

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Converted checkpoint, training checkpoint or workdir.")
_TOKENIZER = flags.DEFINE_string(
    "tokenizer", None, "Tokenizer file; default: the checkpoint's.")
_TASKS = flags.DEFINE_list("tasks", list(harness.BUNDLED_TASKS),
                           "lm-eval tasks or groups; empty for none.")
_INCLUDE_PATH = flags.DEFINE_multi_string(
    "include_path", [], "A folder of more task YAML files (repeatable).")
_BUILTIN_TASKS = flags.DEFINE_bool(
    "builtin_tasks", False, "Also index lm-eval's own tasks (most need the "
    "Hugging Face Hub).")
_LIMIT = flags.DEFINE_integer("limit", None, "Documents per task at most.")
_NUM_FEWSHOT = flags.DEFINE_integer("num_fewshot", None,
                                    "Overrides the tasks' few-shot count.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", lm_eval_adapter.DEFAULT_BATCH_SIZE, "Requests per batch.")
_MAX_LENGTH = flags.DEFINE_integer(
    "max_length", lm_eval_adapter.DEFAULT_MAX_LENGTH,
    "Most tokens the model sees at once.")
_MAX_GEN_TOKS = flags.DEFINE_integer(
    "max_gen_toks", lm_eval_adapter.DEFAULT_MAX_GEN_TOKS,
    "Generated tokens when a task does not say.")
_ADD_BOS = flags.DEFINE_bool("add_bos", False,
                             "Start each context with BOS (Gemma).")
_SEED = flags.DEFINE_integer("seed", 0, "Few-shot and sampling seed.")
_CHAT_TEMPLATE = flags.DEFINE_string(
    "chat_template", None,
    "Render each task request as a user turn (few-shot examples as earlier"
    " turns) with this chat template: 'chatml', a .jinja file or a"
    " tokenizer_config.json (e.g. the checkpoint's); default: plain text.")
_PERPLEXITY_DATA = flags.DEFINE_multi_string(
    "perplexity_data", [], "Files (glob patterns) to measure perplexity on.")
_PERPLEXITY_FORMAT = flags.DEFINE_string(
    "perplexity_format", "jsonl", "text, jsonl, parquet, arrayrecord, arrow.")
_PERPLEXITY_FIELD = flags.DEFINE_string("perplexity_text_field", "text",
                                        "Field holding the text.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the scores here (JSON).")
_LOG_SAMPLES = flags.DEFINE_bool(
    "log_samples", False, "With --output: also write every task request and"
    " the model's responses.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _TASKS.value and not _PERPLEXITY_DATA.value:
    raise app.UsageError("Give --tasks, --perplexity_data or both.")
  with cli.errors_in_one_line("eval"):
    _evaluate()


def _evaluate() -> None:
  checkpoint = paths.user_path(_CHECKPOINT.value)
  lm = lm_eval_adapter.MaxTextLM.from_checkpoint(
      checkpoint,
      tokenizer=_TOKENIZER.value and paths.user_path(_TOKENIZER.value),
      max_length=_MAX_LENGTH.value, batch_size=_BATCH_SIZE.value,
      max_gen_toks=_MAX_GEN_TOKS.value, add_bos=_ADD_BOS.value,
      seed=_SEED.value,
      chat_template=_CHAT_TEMPLATE.value and chat_lib.load_template(
          chat_lib.user_template(_CHAT_TEMPLATE.value),
          key="--chat_template"))
  logging.info("Loaded %s with tokenizer %s.", checkpoint,
               lm.text_tokenizer.path)
  out = {}
  if _TASKS.value:
    results = harness.evaluate(
        lm, _TASKS.value,
        include_paths=[paths.user_path(p) for p in _INCLUDE_PATH.value],
        builtin_tasks=_BUILTIN_TASKS.value, limit=_LIMIT.value,
        num_fewshot=_NUM_FEWSHOT.value, log_samples=_LOG_SAMPLES.value,
        seed=_SEED.value, apply_chat_template=bool(_CHAT_TEMPLATE.value))
    print(harness.table(results))
    out["tasks"] = harness.scores(results)
    if _LOG_SAMPLES.value:
      out["samples"] = results["samples"]
  if _PERPLEXITY_DATA.value:
    documents = perplexity.read_documents(
        [paths.user_path(p) for p in _PERPLEXITY_DATA.value],
        lm.text_tokenizer, kind=_PERPLEXITY_FORMAT.value,
        text_field=_PERPLEXITY_FIELD.value, limit=_LIMIT.value)
    result = perplexity.perplexity(lm.scorer, documents,
                                   prefix_id=lm.prefix_token_id)
    print(f"perplexity: {result.perplexity:.4f} ({result.tokens} tokens in"
          f" {result.documents} documents)")
    out["perplexity"] = dataclasses.asdict(result)
  if _OUTPUT.value:
    with open(paths.user_path(_OUTPUT.value), "w",
              encoding="utf-8") as f:
      json.dump(out, f, indent=2, default=str)
      f.write("\n")


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-eval`."""
  flags.mark_flag_as_required("checkpoint")
  app.run(main)


if __name__ == "__main__":
  console_main()
