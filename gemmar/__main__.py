"""``python -m gemmar ...`` is the ``gemmar`` command."""

import sys

from .console import main

sys.exit(main())
