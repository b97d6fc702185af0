"""xla_options: CPU programs compile at LLVM -O1; others and the user's
$XLA_FLAGS keep their own level."""

import glob
import os
import types

from absl.testing import absltest
import jax
import jax.numpy as jnp

from maxtext.trainers import xla_options

_LEVEL = "xla_backend_optimization_level"


class XlaOptionsTest(absltest.TestCase):

  def test_cpu_only_and_the_users_level_wins(self):
    with absltest.mock.patch.dict("os.environ", {"XLA_FLAGS": ""}):
      self.assertEqual(xla_options.compiler_options(jax.devices()),
                       {_LEVEL: 1})
      gpus = [types.SimpleNamespace(platform="gpu")]
      self.assertEqual(xla_options.compiler_options(gpus), {})
    with absltest.mock.patch.dict("os.environ",
                                  {"XLA_FLAGS": f"--{_LEVEL}=3"}):
      self.assertEqual(xla_options.compiler_options(jax.devices()), {})

  def test_xla_compiles_with_the_options(self):
    # XLA's dump of a compiled program lists the options it compiled with.
    dump = self.create_tempdir().full_path
    mesh = jax.make_mesh((1,), ("data",))
    lowered = jax.jit(lambda x: jnp.sin(x) * 2).lower(jnp.ones(8))
    # Whatever level the environment sets (the tests' own is 0), a program
    # compiled with the options has theirs.
    with absltest.mock.patch.dict(xla_options.CPU_OPTIONS,
                                  {"xla_dump_to": dump}), (
        absltest.mock.patch.dict("os.environ", {"XLA_FLAGS": ""})):
      compiled = xla_options.compile_for(lowered, mesh)
    self.assertEqual(list(compiled(jnp.zeros(8))), [0.0] * 8)
    (options,) = glob.glob(os.path.join(dump, "*.debug_options"))
    with open(options) as f:
      self.assertIn(f"{_LEVEL}: 1\n", f.read())


if __name__ == "__main__":
  absltest.main()
