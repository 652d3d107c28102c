"""Ctrl-C on the command line while a module is being imported: one line and exit 130, whatever the import was doing."""

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


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise_unless_importing(signum, frame) -> None:
    # The commands import torch when they first need it, after `raise_again()`: a KeyboardInterrupt raised inside a
    # C extension's import leaves it half-loaded, and the next import of it fails with a traceback (CI, torch 2.13.0:
    # numpy's "cannot load module more than once per process", Ctrl-C 0.3 s into `python -m toolkit cases`). Inside
    # an import, stop at once as before the command began: a command's workers die with it, as under kill -9.
    if _importing(frame):
        _stop_at_once(signum, frame)
    signal.default_int_handler(signum, frame)


def stop_at_once_while_importing() -> None:
    """From here until `raise_again()`, Ctrl-C ends the process at once with "interrupted" and 130."""
    try:
        signal.signal(signal.SIGINT, _stop_at_once)
    except ValueError:  # not the main thread: the import's own KeyboardInterrupt handling applies
        pass


def raise_again() -> None:
    """Ctrl-C raises KeyboardInterrupt again (the running command stops its workers and keeps finished results),
    except while a module is being imported, where it still stops at once; a handler someone else installed
    (Jupyter's) is left alone."""
    try:
        if signal.getsignal(signal.SIGINT) is _stop_at_once:
            signal.signal(signal.SIGINT, _raise_unless_importing)
    except ValueError:
        pass
