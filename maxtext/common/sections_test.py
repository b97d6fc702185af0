"""Tests for maxtext.common.sections, the config front door."""

import dataclasses
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.common import paths
from maxtext.common import sections


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Train:
  steps: int
  rate: float = 0.1
  scale: float | None = None
  name: str = "run"
  fast: bool = False
  data: str = paths.field(paths.user_patterns, default="")

  def __post_init__(self):
    sections.check_int("train.steps", self.steps, minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Logging:
  every_steps: int = 1


_SECTIONS = {"train": _Train, "logging": _Logging}


def _config(**train):
  return ml_collections.ConfigDict(
      {"train": {"steps": 3, **train}, "logging": {"every_steps": 2}})


class BuildSectionsTest(parameterized.TestCase):

  def test_builds_every_section(self):
    built = sections.build_sections(_config(rate=2), _SECTIONS)
    self.assertEqual(built["train"], _Train(steps=3, rate=2))
    self.assertEqual(built["logging"], _Logging(every_steps=2))

  def test_unknown_and_missing_sections_are_named(self):
    config = _config()
    config.logginq = config.logging
    del config["logging"]
    with self.assertRaisesRegex(
        ValueError, r"Unknown config section\(s\) \['logginq'\] \(did you"
        r" mean 'logging'\?\); missing config section\(s\) \['logging'\];"
        r" valid sections: \['train', 'logging'\]\."):
      sections.build_sections(config, _SECTIONS)
    with self.assertRaisesRegex(
        ValueError, r"^Missing config section\(s\) \['logging'\]"):
      sections.build_sections({"train": {"steps": 1}}, _SECTIONS)

  def test_optional_sections_are_allowed_and_left_to_the_caller(self):
    config = _config()
    config.model = {"anything": 1}
    built = sections.build_sections(config, _SECTIONS, optional=("model",))
    self.assertNotIn("model", built)

  def test_unknown_missing_and_mistyped_keys_are_named(self):
    with self.assertRaisesRegex(
        ValueError, r"Unknown config key 'train.stepz' \(did you mean"
        r" 'train.steps'\?\); valid keys of 'train'"):
      sections.build_section("train", _Train, {"steps": 1, "stepz": 2})
    with self.assertRaisesRegex(ValueError,
                                "Missing config key 'train.steps'"):
      sections.build_section("train", _Train, {})
    with self.assertRaisesRegex(
        ValueError, "train.steps='3' is a str; it must be a int"):
      sections.build_section("train", _Train, {"steps": "3"})
    with self.assertRaisesRegex(
        ValueError, "train.scale='x' is a str; it must be a float or None"):
      sections.build_section("train", _Train, {"steps": 1, "scale": "x"})
    with self.assertRaisesRegex(ValueError, "train.fast=1 is a int"):
      sections.build_section("train", _Train, {"steps": 1, "fast": 1})
    with self.assertRaisesRegex(ValueError, "section 'train' must be a"
                                " mapping"):
      sections.build_section("train", _Train, 3)

  @parameterized.parameters(
      ("rate", float("nan")), ("rate", float("inf")),
      ("scale", float("-inf")), ("scale", float("nan")))
  def test_non_finite_floats_are_refused_naming_the_key(self, key, value):
    with self.assertRaisesRegex(
        ValueError, rf"^train\.{key}={value!r} must be a finite number\.$"):
      sections.build_section("train", _Train, {"steps": 1, key: value})

  def test_ints_are_valid_floats_and_none_where_allowed(self):
    built = sections.build_section("train", _Train,
                                   {"steps": 1, "rate": 1, "scale": None})
    self.assertEqual((built.rate, built.scale), (1, None))

  def test_user_paths_resolve_and_the_config_dict_is_unchanged(self):
    config = _config(data="a/*.jsonl,/abs/b.jsonl")
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/me"}):
      built = sections.build_sections(config, _SECTIONS)
    self.assertEqual(built["train"].data, "/home/me/a/*.jsonl,/abs/b.jsonl")
    self.assertEqual(config.train.data, "a/*.jsonl,/abs/b.jsonl")


class ValidatorsTest(parameterized.TestCase):

  @parameterized.parameters(
      (0, {"minimum": 1}, r"s\.k=0 must be an integer >= 1\."),
      (True, {}, r"s\.k=True must be an integer\."),
      (2.0, {}, r"s\.k=2\.0 must be an integer\."),
      (9, {"minimum": 0, "maximum": 8},
       r"s\.k=9 must be an integer in \[0, 8\]\."),
      (9, {"maximum": 8}, r"s\.k=9 must be an integer <= 8\."))
  def test_check_int(self, value, bounds, message):
    with self.assertRaisesRegex(ValueError, message):
      sections.check_int("s.k", value, **bounds)

  def test_check_int_accepts_values_in_range(self):
    sections.check_int("s.k", 0, minimum=0, maximum=0)
    sections.check_int("s.k", -5)

  @parameterized.parameters(
      (float("nan"), {}, r"s\.k=nan must be a finite number\."),
      (float("inf"), {"minimum": 0}, r"must be a finite number >= 0\."),
      (-1.0, {"minimum": 0}, r"s\.k=-1\.0 must be a finite number >= 0\."),
      (0.0, {"above": 0}, r"must be a finite number > 0\."),
      (0.7, {"minimum": 0, "maximum": 0.5}, r"in \[0, 0\.5\]"),
      ("1", {}, r"s\.k='1' must be a finite number"))
  def test_check_float(self, value, bounds, message):
    with self.assertRaisesRegex(ValueError, message):
      sections.check_float("s.k", value, **bounds)

  def test_choice_and_bool(self):
    with self.assertRaisesRegex(
        ValueError, r"s\.k='c' is invalid; valid values: \('a', 'b'\)\."):
      sections.check_choice("s.k", "c", ("a", "b"))
    sections.check_choice("s.k", "a", ("a", "b"))
    with self.assertRaisesRegex(ValueError, r"s\.k=1 must be True or False"):
      sections.check_bool("s.k", 1)
    sections.check_bool("s.k", False)


if __name__ == "__main__":
  absltest.main()
