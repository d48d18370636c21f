"""``python -m gemmar ...`` is the ``gemmar`` command."""

import sys

from .cli import main

sys.exit(main())
