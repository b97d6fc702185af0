"""What the binaries share about failing: errors of bad input in one line.

`with errors_in_one_line("train"):` turns an expected error (bad config,
missing file, ...) into `SystemExit("train: error: <Type>: <message>")`: one
line on stderr and exit status 1, with the traceback logged at
--verbosity=1 rather than printed. An interrupt that the run did not turn
into a clean stop (a second Ctrl-C, `maxtext.trainers.preemption`) is one
line too, with status 130 (128 + SIGINT).
"""

from collections.abc import Iterator
import contextlib
import sys
import traceback

from absl import logging

# Exit status after an interrupt (Ctrl-C) that stopped the run at once.
EXIT_CODE_INTERRUPTED = 130
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
  except KeyboardInterrupt:
    print(f"{program}: interrupted; checkpoints saved before are kept.",
          file=sys.stderr)
    raise SystemExit(EXIT_CODE_INTERRUPTED) from None
  except expected as e:
    logging.debug("%s", traceback.format_exc())
    message = " ".join(str(e).split())
    raise SystemExit(
        f"{program}: error: {type(e).__name__}: {message}") from None
