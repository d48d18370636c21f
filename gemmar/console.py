"""The ``gemmar`` command's entry point. It imports the CLI (torch and Triton: seconds) inside the Ctrl-C
guard, so that an interrupt while the command starts is one line too, not a traceback from an import.

Ctrl-C ends the command at once from the signal handler, whenever it comes: while the CLI is imported (a
KeyboardInterrupt raised inside a library's import can be swallowed by that library or reported again at
shutdown; CI once saw the line printed and then the process end by SIGINT, exit -2), while the engines start
(an asyncio "Task was destroyed" dump), mid-run (2.3-3.7 s of cleanup at a load of 10), just after PASSED (an
``EngineCluster.__del__`` traceback) or a second time during the cleanup of the first (a traceback). Nothing is
lost by not cleaning up here: every cluster's reaper (runtime/reaper.py) ends its engines and removes its files
when their owner, this process, ends, however it ends; output already written is flushed first.
"""

import sys

from .errors import UsageError
from .interrupts import exit_on_interrupt


def main():
    exit_on_interrupt()
    try:
        from .cli import main as cli_main
    except UsageError as e:   # e.g. a Triton release gemmar does not accept
        print(f"gemmar: error: {e}", file=sys.stderr)
        return 2
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
