"""Iris's ``iris.host.logging``: the ``iris`` logger's formatter, ``[Iris] [rank/world] message``.

A record may carry ``iris_rank`` and ``iris_num_ranks`` (``[?/?]`` without them) and ``iris_internal`` (then the
file it came from is named too: ``[Iris] [0/4] [all_gather] message``). gemmar's own ``[Iris]`` lines
(``shmem.info``) are printed by ``host.py``; ``gemmar run`` already says which rank a line comes from.
"""

import logging
import os


class IrisFormatter(logging.Formatter):
    def format(self, record):
        rank = getattr(record, "iris_rank", "?")
        world = getattr(record, "iris_num_ranks", "?")
        where = ""
        if getattr(record, "iris_internal", False) and record.pathname:
            where = f" [{os.path.splitext(os.path.basename(record.pathname))[0]}]"
        return f"[Iris] [{rank}/{world}]{where} {record.getMessage()}"


def iris_logger(level):
    """The ``iris`` logger, writing through :class:`IrisFormatter` (made once per process)."""
    logger = logging.getLogger("iris")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(IrisFormatter())
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    return logger
