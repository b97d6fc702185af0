"""Tests of maxtext.aot.sweep on compile-only v5e devices."""

import dataclasses

from absl.testing import absltest

from maxtext.aot import sweep
from maxtext.aot import tiny_experiment
from maxtext.aot import topology
from maxtext.trainers.config import ExperimentConfig


class SweepTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Dimensions that stay multiples of TPU tiles (128) when split 4 ways,
    # and long rows, so that layouts and remat change memory as on a big
    # model rather than by tile padding. Two unrolled layers: remat keeps
    # one layer's activations instead of both, and the costs need no
    # extrapolation.
    config = tiny_experiment.tiny_config(
        num_layers=2, scan_layers=False, vocab_size=1024, embed_dim=512,
        mlp_dim=1024, num_heads=8, num_kv_heads=4, head_dim=64)
    # Plain-XLA attention: with the splash kernel (`auto` on TPU) full remat
    # reports more HBM temporaries at this size (12.5 MB against 10.7 MB
    # without), although its scratch in all is smaller (HBM + VMEM, 52.2
    # MB against 63.7 MB): the whole working set fits in v5e's VMEM, and
    # XLA keeps more of the no-remat program's temporaries there (53.0 MB
    # against 39.7 MB). Only the layer inputs are saved under full remat,
    # no splash residuals. At 4 layers of width 1024 over 2048 tokens full
    # remat halves splash's temporaries (607 MB against 1,233 MB).
    config.attention_kernel.impl = "reference"
    config.data.seq_len = 256
    cls.experiment = ExperimentConfig.from_config_dict(config)
    cls.hardware = topology.hardware_for("v5e:2x2")
    # Three TPU compiles in all (libtpu's take most of this test's time):
    # the layouts without remat, and FSDP with full remat.
    cls.rows = sweep.sweep(
        cls.experiment, cls.hardware,
        [sweep.parse_layout(text) for text in ("fsdp=4", "data=4", "fsdp=3")],
        ["none"])
    [cls.full] = sweep.sweep(cls.experiment, cls.hardware,
                             [sweep.parse_layout("fsdp=4")], ["full"])

  def test_layouts_are_compiled_and_ranked(self):
    rows = self.rows
    self.assertLen(rows, 3)
    by_layout = {row.layout_text(): row for row in rows}
    # fsdp=3 does not cover the 4 devices: listed last, with the reason.
    self.assertEqual(rows[-1].layout_text(), "fsdp=3")
    self.assertIn("needs 3 devices", rows[-1].error)
    self.assertFalse(rows[-1].out_of_memory)
    fitting = rows[:2]
    self.assertTrue(all(row.fits for row in fitting))
    times = [row.report.step_time_s for row in fitting]
    self.assertEqual(times, sorted(times))
    # FSDP splits the state 4 ways; data parallelism keeps it whole.
    fsdp, data = by_layout["fsdp=4"], by_layout["data=4"]
    self.assertGreater(data.report.argument_bytes,
                       3 * fsdp.report.argument_bytes)
    table = sweep.format_table(rows, self.hardware.memory_name)
    self.assertEqual(table.splitlines()[1].split()[:3],
                     ["1", rows[0].layout_text(), rows[0].remat_policy])
    self.assertIn("invalid: mesh.ici", table)

  def test_full_remat_keeps_less_and_recomputes(self):
    fsdp = {row.layout_text(): row for row in self.rows}["fsdp=4"]
    self.assertEqual((self.full.layout_text(), self.full.remat_policy),
                     ("fsdp=4", "full"))
    self.assertLess(self.full.report.temp_bytes, fsdp.report.temp_bytes)
    self.assertGreater(self.full.report.xla_flops, fsdp.report.xla_flops)

  def test_rank_puts_fitting_rows_first(self):
    row = self.rows[0]
    report = row.report
    fast = dataclasses.replace(row, report=dataclasses.replace(
        report, step_time_s=report.step_time_s / 2))
    too_big = dataclasses.replace(row, report=dataclasses.replace(
        report, memory_bytes=report.total_bytes - 1))
    oom = sweep.SweepRow(row.layout, "none", None, "does not fit",
                         out_of_memory=True)
    invalid = sweep.SweepRow(row.layout, "none", None, "bad layout")
    ranked = sweep.rank([invalid, oom, too_big, row, fast])
    self.assertEqual(ranked, [fast, row, too_big, oom, invalid])
    self.assertFalse(too_big.fits)

  def test_bad_layouts_and_policies_are_named(self):
    with self.assertRaisesRegex(ValueError, r"'fsdp:4' of 'fsdp:4' is not"
                                r" axis=size"):
      sweep.parse_layout("fsdp:4")
    experiment = tiny_experiment.tiny_experiment(num_layers=1)
    hardware = topology.hardware_for("v5e-1")
    with self.assertRaisesRegex(ValueError, r"Unknown remat policies"
                                r" \['fastest'\]; valid: \['none'"):
      sweep.sweep(experiment, hardware, [sweep.parse_layout("fsdp=1")],
                  ["fastest"])

  def test_default_layouts_divide_heads_and_devices(self):
    experiment = tiny_experiment.tiny_experiment()  # 4 heads, 2 kv heads.
    texts = [",".join(f"{k}={v}" for k, v in layout.items() if v > 1)
             for layout in sweep.default_layouts(experiment, 8)]
    self.assertEqual(texts, ["fsdp=8", "fsdp=4,tensor=2", "data=2,fsdp=4",
                             "data=4,fsdp=2"])


if __name__ == "__main__":
  absltest.main()
