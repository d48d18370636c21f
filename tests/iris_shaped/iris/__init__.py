"""An Iris-shaped package for gemmar's tests (see ../README.md): Iris's layout, none of its code."""

from iris.host.iris import Iris, iris  # noqa: F401
from iris.host.platform import hip  # noqa: F401
from iris.device import Peer, read_from  # noqa: F401
from . import ops  # noqa: F401
