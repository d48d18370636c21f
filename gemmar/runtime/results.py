"""What a rank sends back to the client: the contract between ``runtime/rank.py`` and ``cluster.py``.

Both types travel from engine to client by pickle, so they hold plain values, numpy arrays and tensors.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import DeadlockError, GemmarError, UsageError
from ..kernels.events import COLUMNS


@dataclass
class RankResult:
    """One rank's view of a run of back-to-back launches."""

    rank: int
    max_abs_diff: list            # per iteration: max |C - reference| on this rank, or None when not checked
    seconds: list                 # per iteration: host time of the launch on this rank
    tolerance: float              # what max_abs_diff is checked against
    t_zero_ns: int                # the device clock as this rank left the barrier before the first launch
    dropped_events: int = 0       # trace events that did not fit (0 unless the trace room was sized wrong)
    events: np.ndarray = field(default_factory=lambda: np.zeros((0, len(COLUMNS)), np.int64))  # trace rows
    C: torch.Tensor = None        # this rank's C after the last launch, when asked for
    kernels: list = field(default_factory=list)  # GPU: per compiled kernel, its registers and spills
    # Traced runs: the device clock as this rank left the barrier before each iteration ([0] = t_zero_ns).
    # Ranks on different GPUs read different clocks, which also drift apart: a trace aligns each
    # iteration on its own barrier, not only the first.
    iteration_starts_ns: list = field(default_factory=list)
    sanitizer: dict = None        # sanitize=True: this rank's record of heap accesses (gemmar/sanitizer)

    @property
    def ok(self):
        return all(d is not None and d <= self.tolerance for d in self.max_abs_diff)


@dataclass
class RankFailure:
    """An error the user must see (bad input, a deadlock), as one rank saw it."""

    rank: int
    error: GemmarError

    @staticmethod
    def raise_first(outs):
        """Raise one error for a list of per-rank outcomes: usage first, then every rank's deadlock together."""
        failures = [o for o in outs if isinstance(o, RankFailure)]
        usage = [f.error for f in failures if isinstance(f.error, UsageError)]
        if usage:
            raise usage[0]
        waits = []
        for f in failures:   # ranks hosted by one engine share one error: each wait once
            if isinstance(f.error, DeadlockError):
                waits += [w for w in f.error.waits if w not in waits]
        if waits:
            raise DeadlockError(waits)
        if failures:
            raise GemmarError("; ".join(f"rank {f.rank}: {f.error}" for f in failures))
