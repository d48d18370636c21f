"""The ``gemmar`` command's entry point. It imports the CLI (torch and Triton: seconds) inside the Ctrl-C
guard, so that an interrupt while the command starts is one line too, not a traceback from an import.

While the CLI is imported, Ctrl-C ends the process at once from the signal handler: nothing has started
yet that needs cleaning up, and a KeyboardInterrupt raised inside a library's import can be swallowed by
that library or reported again at shutdown (CI once saw the line printed and then the process end by
SIGINT, exit -2, depending on where in torch's import the signal landed).
"""

import os
import signal
import sys

from .errors import UsageError


def main():
    def interrupted(signum, frame):
        sys.stderr.write("gemmar: interrupted\n")
        sys.stderr.flush()
        os._exit(130)

    # (Only where Ctrl-C is not ignored: a command started in the background keeps ignoring it.)
    previous = signal.getsignal(signal.SIGINT)
    guarded = previous is not signal.SIG_IGN
    if guarded:
        signal.signal(signal.SIGINT, interrupted)
    try:
        from .cli import main as cli_main
    except UsageError as e:   # e.g. a Triton release gemmar does not accept
        print(f"gemmar: error: {e}", file=sys.stderr)
        return 2
    finally:
        if guarded:
            signal.signal(signal.SIGINT, previous)
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
