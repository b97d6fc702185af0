"""Multi-device tests on CPU: skip clearly when the fake devices are missing."""

from absl.testing import absltest
import jax


def require_devices(count: int) -> None:
  """Skips the calling test (or class) unless there are `count` devices.

  Raises:
    absltest.SkipTest: naming the setting that gives `count` CPU devices.
  """
  if jax.device_count() < count:
    raise absltest.SkipTest(
        f"needs {count} devices: JAX_NUM_CPU_DEVICES={count}")
