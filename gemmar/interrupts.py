"""Ctrl-C on the command line: one line and exit code 130, at once, whenever it comes (``console.py`` and
``python -m gemmar.cli`` install it before anything slow; in Python and notebooks Ctrl-C stays a KeyboardInterrupt)."""

import os
import signal
import sys


def _interrupted(signum, frame):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: exiting anyway
            pass
    os.write(2, b"gemmar: interrupted\n")
    os._exit(130)


def exit_on_interrupt():
    """From now on Ctrl-C (SIGINT) ends this process at once with one line and exit code 130: for the command
    line only (in Python and notebooks Ctrl-C stays a KeyboardInterrupt that stops the call's ranks). Not where
    Ctrl-C is ignored: a command started in the background keeps ignoring it."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupted)
