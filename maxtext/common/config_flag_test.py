"""Tests for maxtext.common.config_flag."""

from absl import flags
from absl.testing import absltest

from maxtext.common import config_flag

_CONFIG_FILE = """
import ml_collections

def get_config():
  return ml_collections.ConfigDict(
      {"optimizer": {"learning_rate": 1e-3}, "train": {"steps": 10},
       "model": {"num_layers": 2}})
"""


class ConfigFlagTest(absltest.TestCase):

  def _parse(self, *overrides: str):
    path = self.create_tempfile("cfg.py", content=_CONFIG_FILE).full_path
    argv = ["prog", f"--config={path}", *overrides]
    flag_values = flags.FlagValues()
    holder = config_flag.define_config_file(
        "config", "Config file.", flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    return holder.value

  def test_overrides_apply(self):
    config = self._parse("--config.optimizer.learning_rate=0.5")
    self.assertEqual(config.optimizer.learning_rate, 0.5)
    self.assertEqual(config.train.steps, 10)

  def test_misspelt_key_is_a_one_line_flag_error(self):
    with self.assertRaises(flags.IllegalFlagValueError) as raised:
      self._parse("--config.optimizer.learnin_rate=1e-3")
    message = str(raised.exception)
    self.assertEqual(
        message, "--config.optimizer.learnin_rate: unknown config field"
        " 'learnin_rate'. Did you mean \"learning_rate\" instead of"
        " \"learnin_rate\"?")
    # absl's app.run prints a flags.Error as `FATAL Flags parsing error: ...`.
    self.assertIsInstance(raised.exception, flags.Error)

  def test_misspelt_section_is_a_one_line_flag_error(self):
    with self.assertRaisesRegex(
        flags.IllegalFlagValueError,
        r"^--config\.optimizr\.learning_rate: unknown config field"
        r" 'optimizr'\. Did you mean \"optimizer\""):
      self._parse("--config.optimizr.learning_rate=1e-3")

  def test_a_key_that_moved_out_of_the_model_names_its_new_place(self):
    with self.assertRaisesRegex(
        flags.IllegalFlagValueError,
        r"^--config\.model\.remat_policy: Config key 'model.remat_policy'"
        r" moved to 'remat.policy'; set --config.remat.policy instead\.$"):
      self._parse("--config.model.remat_policy=full")

  def test_wrong_type_is_a_one_line_flag_error(self):
    with self.assertRaisesRegex(
        flags.IllegalFlagValueError,
        r"^flag --config\.train\.steps=ten: .*'ten'$"):
      self._parse("--config.train.steps=ten")


if __name__ == "__main__":
  absltest.main()
