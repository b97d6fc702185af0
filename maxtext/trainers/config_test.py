"""Tests for maxtext.trainers.config."""

import os
from unittest import mock

from absl.testing import absltest

from configs import gemma3
from configs import llama3
from maxtext.trainers import config as config_lib
from testing import config_checks


class ExperimentConfigTest(absltest.TestCase):

  def test_family_configs_build(self):
    for module in (gemma3, llama3):
      experiment = config_lib.ExperimentConfig.from_config_dict(
          module.get_config())
      self.assertEqual(experiment.train.steps,
                       module.get_config().train.steps)
      self.assertGreater(experiment.model.vocab_size, 0)

  def test_unknown_key_names_the_key_and_the_valid_keys(self):
    config = gemma3.get_config()
    config.unlock()
    config.optimizer.lr = 1e-3
    with self.assertRaisesRegex(
        ValueError, r"Unknown config key 'optimizer.lr'; valid keys of"
        r" 'optimizer': \[.*'learning_rate'"):
      config_lib.ExperimentConfig.from_config_dict(config)

  def test_misspelt_key_gets_a_suggestion(self):
    config = gemma3.get_config()
    config.unlock()
    config.optimizer.learnin_rate = 1e-3
    with self.assertRaisesRegex(
        ValueError, r"^Unknown config key 'optimizer.learnin_rate' \(did you"
        r" mean 'optimizer.learning_rate'\?\); valid keys of 'optimizer'"):
      config_lib.ExperimentConfig.from_config_dict(config)
    config = gemma3.get_config().to_dict()
    config["optimiser"] = config.pop("optimizer")
    with self.assertRaisesRegex(ValueError, r"\['optimiser'\] \(did you"
                                r" mean 'optimizer'\?\)"):
      config_lib.ExperimentConfig.from_config_dict(config)

  def test_wrong_type_names_key_value_and_type(self):
    for section, key, value, expected in (
        ("train", "steps", "10", "int"), ("train", "steps", 10.0, "int"),
        ("train", "skip_nonfinite", 1, "bool"),
        ("optimizer", "learning_rate", "3e-4", "float"),
        ("checkpoint", "async_save", "yes", "bool"),
        ("checkpoint", "local_dir", 3, "str")):
      config = gemma3.get_config().to_dict()
      config[section][key] = value
      with self.assertRaisesRegex(
          ValueError, rf"^{section}.{key}={value!r} is a"
          rf" {type(value).__name__}; it must be a {expected}\.$"):
        config_lib.ExperimentConfig.from_config_dict(config)
    config = gemma3.get_config().to_dict()
    config["optimizer"]["learning_rate"] = 1  # An int is a valid float.
    config_lib.ExperimentConfig.from_config_dict(config)

  def test_bad_update_options(self):
    config = gemma3.get_config()
    self.assertFalse(config_lib.ExperimentConfig.from_config_dict(
        config).train.skip_nonfinite)
    config.train.spike_zscore = -1.0
    with self.assertRaisesRegex(ValueError, "train.spike_zscore=-1.0"):
      config_lib.ExperimentConfig.from_config_dict(config)
    config = gemma3.get_config()
    config.train.spike_window = 0
    with self.assertRaisesRegex(ValueError, "train.spike_window=0"):
      config_lib.ExperimentConfig.from_config_dict(config)

  def test_unknown_model_key(self):
    config = gemma3.get_config()
    config.model.num_routed_experts = 8
    with self.assertRaisesRegex(ValueError,
                                "'model.num_routed_experts'.*vocab_size"):
      config_lib.ExperimentConfig.from_config_dict(config)

  def test_unknown_and_missing_sections(self):
    config = gemma3.get_config().to_dict()
    config["evaluation"] = {}
    with self.assertRaisesRegex(ValueError, r"\['evaluation'\]; valid"):
      config_lib.ExperimentConfig.from_config_dict(config)
    del config["evaluation"]
    del config["logging"]
    with self.assertRaisesRegex(ValueError, r"Missing.*\['logging'\]"):
      config_lib.ExperimentConfig.from_config_dict(config)

  def test_missing_key_is_named(self):
    config = gemma3.get_config().to_dict()
    del config["train"]["seed"]
    with self.assertRaisesRegex(ValueError, "'train.seed'"):
      config_lib.ExperimentConfig.from_config_dict(config)

  def test_invalid_value_is_named(self):
    config = gemma3.get_config()
    config.train.steps = 0
    with self.assertRaisesRegex(ValueError, "train.steps=0"):
      config_lib.ExperimentConfig.from_config_dict(config)
    config = gemma3.get_config()
    config.logging.every_steps = 0
    with self.assertRaisesRegex(ValueError, "logging.every_steps=0"):
      config_lib.ExperimentConfig.from_config_dict(config)

  def test_floats_refuse_nan_and_inf_and_paths_resolve(self):
    config_checks.assert_front_door(
        self, config_lib.ExperimentConfig.from_config_dict,
        gemma3.get_config(), config_lib.SECTIONS)

  def test_mixture_files_resolve_as_the_user_meant(self):
    config = gemma3.get_config()
    config.data.source = "mixture"
    config.data.mixture = {"a": {"source": "jsonl", "files": "x/*.jsonl, y",
                                 "weight": 1.0}}
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/u"}):
      built = config_lib.ExperimentConfig.from_config_dict(config)
    (name, component), = built.data.components()
    self.assertEqual((name, component.files), ("a", "/u/x/*.jsonl,/u/y"))
    self.assertEqual(config.data.mixture.a.files, "x/*.jsonl, y")


if __name__ == "__main__":
  absltest.main()
