"""`py_test` for this repository: every test compiles with cheap XLA settings.

Tests compile hundreds of tiny programs, and XLA's LLVM optimisation of each
costs more than it saves when a program runs a few times: with LLVM's
optimisation off, `//maxtext/models:decoder_test` took 51 s instead of 79 s.
The flags go after the target's own `XLA_FLAGS` (e.g. a fake device count);
`--test_env` cannot do this, as it replaces a target's `env` in Bazel 4.
"""

FAST_COMPILE_XLA_FLAGS = ("--xla_backend_optimization_level=0" +
                          " --xla_llvm_disable_expensive_passes=true")

def py_test(name, env = {}, **kwargs):
    """`native.py_test` with `FAST_COMPILE_XLA_FLAGS` added to `XLA_FLAGS`.

    Args:
      name: Target name.
      env: The test's environment; its `XLA_FLAGS`, if any, come first.
      **kwargs: The other `py_test` attributes.
    """
    env = dict(env)
    env["XLA_FLAGS"] = " ".join([f for f in [env.get("XLA_FLAGS"), FAST_COMPILE_XLA_FLAGS] if f])
    native.py_test(name = name, env = env, **kwargs)
