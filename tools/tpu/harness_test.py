"""The chip harness at CPU sizes: its kernel and model suites run in their
own processes and every check passes on the CPU (Pallas in interpret mode),
the summary counts them, a bad flag is refused, and the wheel list reads
our lock's pins."""

import contextlib
import io
import json
import os

from absl.testing import absltest

from tools.tpu import harness
from tools.tpu import wheels


class HarnessTest(absltest.TestCase):

  def test_suites_pass_on_the_cpu_and_are_summarised(self):
    out = self.create_tempdir().full_path
    status = harness.main([
        "--suites=kernels,models", "--small", f"--out={out}",
        "--only=gmm,paged_attention,gated_delta_rule,qwen3_moe"])
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
      summary = json.load(f)
    self.assertEqual(status, 0, summary)
    kernels, models = summary["kernels"], summary["models"]
    self.assertEqual(kernels["environment"]["backend"], "cpu")
    # gmm: 3 layouts x 2 dtypes x 3 impls; paged: 3 x 2; the delta rule 2.
    self.assertEqual((kernels["checks"], kernels["failed"]), (26, []))
    # qwen3_moe's logits and its MoE gradients.
    self.assertEqual((models["checks"], models["failed"]), (2, []))
    with open(os.path.join(out, "kernels.json"), encoding="utf-8") as f:
      results = json.load(f)["results"]
    self.assertTrue(all(r["errors"]["d1"] <= r["tolerance"]
                        for r in results if r["name"].startswith("gmm")))
    with open(os.path.join(out, "log.txt"), encoding="utf-8") as f:
      self.assertIn("== models: 0 in", f.read())

  def test_unknown_suite_is_refused(self):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
      harness.main(["--suites=kernels,bench", "--out=/tmp/x"])
    self.assertIn("--suites='kernels,bench': give one or more of kernels,"
                  " models", err.getvalue())

  def test_lock_pins(self):
    lock = self.create_tempfile(content=(
        "jax==0.10.2 \\\n    --hash=sha256:00\n"
        "Orbax_Checkpoint==0.12.8 \\\n    --hash=sha256:11\n"
        "    # via flax\n"))
    self.assertEqual(wheels.read_lock(lock.full_path),
                     {"jax": "0.10.2", "orbax-checkpoint": "0.12.8"})


if __name__ == "__main__":
  absltest.main()
