"""``shmem.tracing`` on gemmar: Iris's device-side event tracing, recorded and exported.

A program turns it on (``shmem.tracing.enable(max_events)``), launches kernels that made their context with
``DeviceContext.initialize(context_tensor, rank, world_size, tracing=True)`` and bracket operations with
``ctx.tracing.record_event_start(...)`` / ``record_event_end(handle)``, then calls
``shmem.tracing.export("trace.json", merge=True)``: every rank writes ``trace_rank<r>.json`` and rank 0 merges
them into ``trace.json``. Both are Chrome/Perfetto trace JSON (ui.perfetto.dev), and ``gemmar gantt trace.json``
draws them as it draws gemmar's own per-tile traces (``analysis/iris_trace.py``).

The event buffer lives in the rank's own memory, not on the symmetric heap: only its own rank writes it. Its
address, size and counters travel in the tail of ``shmem.get_device_context()``, which is updated in place,
so a context tensor taken before ``enable()`` records too.
"""

import json
import os
import sys

import numpy as np
import torch

from ..analysis import iris_trace
from ..analysis.iris_trace import EVENT_IDS, EVENT_NAMES, EVENT_WORDS  # noqa: F401 - iris.host.tracing.events
from ..errors import UsageError
from .device import TraceEvent  # noqa: F401 - iris.host.tracing.events.TraceEvent

# The context tensor's tail (after rank, world size and the heap bases): max_events, the counters' address,
# the events' address. All 0 until enable(): kernels then keep nothing.
CONTEXT_TAIL = 3


class Tracing:
    """``shmem.tracing``: ``enable``, ``reset``, ``export``, and what was recorded (``trace_counter``)."""

    def __init__(self, shmem):
        self._shmem = shmem
        self.enabled = False
        self.max_events = 0
        self.events = None          # int64 [max_events, EVENT_WORDS]
        self.counters = None        # int32 [events claimed, operations numbered]

    @property
    def trace_counter(self):
        """How many events kernels tried to record since the last reset (Iris's name; a 1-element tensor)."""
        return self.counters[:1] if self.enabled else torch.zeros(1, dtype=torch.int32)

    def enable(self, max_events=1_000_000):
        """Make a buffer for ``max_events`` events and point the device context at it."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or not 1 <= max_events <= 1 << 26:
            raise UsageError(f"shmem.tracing.enable(max_events={max_events!r}): give a whole number of events "
                             f"from 1 to {1 << 26} ({EVENT_WORDS * 8} bytes each)")
        device = self._shmem.get_device()
        self.events = torch.full((max_events, EVENT_WORDS), -1, dtype=torch.int64, device=device)
        self.counters = torch.zeros(2, dtype=torch.int32, device=device)
        self.max_events, self.enabled = max_events, True
        self._point_context()
        self._shmem.info(f"Device tracing enabled with max {max_events} events")

    def _point_context(self):
        context = self._shmem.get_device_context()
        tail = [self.max_events, self.counters.data_ptr(), self.events.data_ptr()] if self.enabled else [0, 0, 0]
        context[-CONTEXT_TAIL:] = torch.tensor(tail, dtype=torch.int64)

    def reset(self):
        """Forget what was recorded (the buffer stays)."""
        if not self.enabled:
            self._shmem.warning("tracing.reset(): tracing is not enabled; call shmem.tracing.enable() first")
            return
        self._synchronize()
        self.counters.zero_()
        self.events.fill_(-1)

    def _synchronize(self):
        if self.events is not None and self.events.is_cuda:
            torch.cuda.synchronize(self.events.device)

    def recorded(self):
        """(rows of :data:`iris_trace.RECORDED` words, how many events did not fit)."""
        self._synchronize()
        claimed = int(self.counters[0].item())
        kept = min(claimed, self.max_events)
        return self.events[:kept].cpu().numpy().astype(np.int64), claimed - kept

    def export(self, filename="trace.json", merge=False):
        """Write this rank's events to ``<filename stem>_rank<r>.json``; with ``merge=True`` (a collective: every
        rank calls it) rank 0 also writes all ranks' events, on one time axis, to ``filename``. Returns the
        document written (rank 0's merged one when merging; ``{}`` on other ranks then)."""
        if not self.enabled:
            self._shmem.warning("tracing.export(): tracing is not enabled; call shmem.tracing.enable() first")
            return {}
        shmem = self._shmem
        rows, dropped = self.recorded()
        if dropped:
            shmem.warning(f"tracing.export(): {dropped} events did not fit in max_events={self.max_events}; "
                          f"the first {self.max_events} are kept")
        stem, extension = os.path.splitext(str(filename))
        per_rank = f"{stem}_rank{shmem.cur_rank}{extension or '.json'}"
        doc = iris_trace.document(iris_trace.perfetto_events(rows, shmem.cur_rank), rank=shmem.cur_rank,
                                  world_size=shmem.num_ranks, num_events=len(rows), dropped_events=dropped,
                                  max_events=self.max_events, process_name=os.path.basename(sys.argv[0] or "?"),
                                  backend=str(shmem.get_device().type))
        with open(per_rank, "w") as f:
            json.dump(doc, f)
        shmem.info(f"Exported rank {shmem.cur_rank} trace ({len(rows)} events) to {per_rank}")
        if not merge:
            return doc
        shmem.barrier()   # every rank's file is written
        merged = {}
        if shmem.cur_rank == 0:
            parts = [f"{stem}_rank{r}{extension or '.json'}" for r in range(shmem.num_ranks)]
            merged = iris_trace.merge(parts, filename)
            count = sum(e.get("ph") != "M" for e in merged["traceEvents"])
            shmem.info(f"Exported {count} events of {shmem.num_ranks} ranks to {filename}: "
                       f"draw it with `gemmar gantt {filename}`, or open it at ui.perfetto.dev")
        shmem.barrier()
        return merged
