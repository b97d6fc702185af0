"""What the binaries share about failing: errors of bad input in one line.

`with errors_in_one_line("train"):` turns an expected error (bad config,
missing file, ...) into `SystemExit("train: error: <Type>: <message>")`: one
line on stderr and exit status 1, with the traceback logged at
--verbosity=1 rather than printed.
"""

from collections.abc import Iterator
import contextlib
import traceback

from absl import logging

# Errors of bad input or a bad environment, as opposed to bugs.
EXPECTED_ERRORS = (ValueError, OSError)


@contextlib.contextmanager
def errors_in_one_line(
    program: str,
    expected: tuple[type[BaseException], ...] = EXPECTED_ERRORS,
) -> Iterator[None]:
  """Reports `expected` errors raised inside as one line from `program`.

  Raises:
    SystemExit: with "<program>: error: <Type>: <message>" (status 1).
  """
  try:
    yield
  except expected as e:
    logging.debug("%s", traceback.format_exc())
    message = " ".join(str(e).split())
    raise SystemExit(
        f"{program}: error: {type(e).__name__}: {message}") from None
