"""Tests which folder `compilation_cache.use` gives JAX (a rerun hitting the
cache is tested end to end in the binaries' tests: train_test, sft_test)."""

import os
from unittest import mock

from absl.testing import absltest

from maxtext.common import compilation_cache


class UseTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    update = mock.patch.object(compilation_cache.jax.config, "update")
    self.update = update.start()
    self.addCleanup(update.stop)

  def test_empty_turns_the_cache_off(self):
    self.assertEqual(compilation_cache.use("", "/w"), "")
    self.update.assert_not_called()

  def test_the_default_is_the_environment_or_else_the_workdir(self):
    with mock.patch.dict(os.environ, {"JAX_COMPILATION_CACHE_DIR": "/c"}):
      self.assertEqual(compilation_cache.use(None, "/w"), "/c")
    self.update.assert_any_call("jax_compilation_cache_dir", "/c")
    with mock.patch.dict(os.environ, {"JAX_COMPILATION_CACHE_DIR": ""}):
      self.assertEqual(compilation_cache.use(None, "/w"),
                       "/w/compilation_cache")
    self.update.assert_any_call("jax_compilation_cache_dir",
                                "/w/compilation_cache")
    # Every program is cached, however fast it compiled.
    self.update.assert_any_call("jax_persistent_cache_min_compile_time_secs",
                                0)

  def test_a_relative_folder_is_the_users(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/u"}):
      self.assertEqual(compilation_cache.use("cache", "/w"), "/home/u/cache")
    self.update.assert_any_call("jax_compilation_cache_dir", "/home/u/cache")


if __name__ == "__main__":
  absltest.main()
