"""The ``gemmar`` command's entry point. It imports the CLI (torch and Triton: seconds) inside the Ctrl-C
guard, so that an interrupt while the command starts is one line too, not a traceback from an import."""

import sys

from .errors import UsageError


def main():
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        print("gemmar: interrupted", file=sys.stderr)
        return 130
    except UsageError as e:   # e.g. a Triton release gemmar does not accept
        print(f"gemmar: error: {e}", file=sys.stderr)
        return 2
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
