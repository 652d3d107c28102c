"""Ctrl-C while the command line is still importing torch: one line and exit 130, whatever the import was doing."""

import os
import signal
import sys


def _stop_at_once(signum, frame) -> None:
    # Nothing has been written yet, so there is nothing to save. A KeyboardInterrupt raised here instead can land in
    # importlib's own weakref callbacks, where CPython prints "Exception ignored … Traceback" that no `except`
    # reaches (seen in a local run on 2.14.1), and may end the process by SIGINT after SystemExit(130) (seen in CI).
    sys.stderr.write("interrupted\n")
    sys.stderr.flush()
    os._exit(130)


def stop_at_once_while_importing() -> None:
    """From here until `raise_again()`, Ctrl-C ends the process at once with "interrupted" and 130."""
    try:
        signal.signal(signal.SIGINT, _stop_at_once)
    except ValueError:  # not the main thread: the import's own KeyboardInterrupt handling applies
        pass


def raise_again() -> None:
    """Ctrl-C raises KeyboardInterrupt again (the running command stops its workers and keeps finished results);
    a handler someone else installed (Jupyter's) is left alone."""
    try:
        if signal.getsignal(signal.SIGINT) is _stop_at_once:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:
        pass
