"""``shmem.tracing`` and ``iris.TraceEvent`` on gemmar.

Iris records device-side events from inside kernels (``DeviceContext.initialize(..., tracing=True)``,
``ctx.tracing.record_event_start``) and exports them. gemmar does not record Iris's device events yet: it
traces its own kernels, per tile, on every rank (``trace=True``, ``gemmar gantt``, Perfetto), and
``iris.ccl`` / ``iris.ops`` run those kernels. Turning Iris's tracing on is refused in one line rather than
handing back an empty trace.
"""

from ..errors import UsageError

# Iris's event ids, by name (what ``TraceEvent().put`` and the others name in Iris's traces).
EVENT_IDS = {"load": 0, "store": 1, "get": 2, "put": 3, "copy": 4, "atomic_add": 5, "atomic_sub": 6,
             "atomic_cas": 7, "atomic_xchg": 8, "atomic_xor": 9, "atomic_and": 10, "atomic_or": 11,
             "atomic_min": 12, "atomic_max": 13, "fetch": 1024, "compute": 2048, "reduce": 2049, "wait": 3072,
             "barrier": 3073}


class TraceEvent:
    """Iris's event ids as attributes (``TraceEvent().put == 3``)."""

    def __getattr__(self, name):
        if name in EVENT_IDS:
            return EVENT_IDS[name]
        raise AttributeError(f"TraceEvent has no event {name!r}: {', '.join(EVENT_IDS)}")


class Tracing:
    """``shmem.tracing``: off, and refused in one line when turned on (see the module's docstring)."""

    enabled = False

    def __init__(self, shmem):
        self._shmem = shmem

    def enable(self, max_events=1_000_000):
        raise UsageError("shmem.tracing.enable(): gemmar does not record Iris's device-side trace events; it traces "
                         "its own kernels per tile (Cluster(...).gemm_all_reduce(trace=True), `gemmar bench --trace`)")

    def reset(self):
        """Nothing recorded, nothing to reset."""

    def export(self, filename="trace.json", merge=False):
        self.enable()
