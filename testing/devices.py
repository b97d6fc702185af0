"""Multi-device tests on CPU: skip clearly when the fake devices are missing."""

from absl.testing import absltest
import jax


def require_devices(count: int) -> None:
  """Skips the calling test (or class) unless there are `count` devices.

  Raises:
    absltest.SkipTest: naming the XLA flag that gives `count` CPU devices.
  """
  if jax.device_count() < count:
    raise absltest.SkipTest(
        f"needs {count} devices: XLA_FLAGS="
        f"--xla_force_host_platform_device_count={count}")
