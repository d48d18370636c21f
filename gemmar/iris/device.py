"""Iris's device side on gemmar: ``DeviceContext``, the timers of ``iris.device.utils``, and the device API.

The device API itself is gemmar's (``gemmar.kernels.device``): the same functions, Iris's argument order and
keywords (``mask=``, ``other=``, ``cache_modifier=``, ``volatile=``, ``hint=``, ``sem=``, ``scope=``). This
module adds what today's Iris programs reach for besides:

- ``DeviceContext`` (Iris: ``iris.DeviceContext``, ``iris.Context``): made in a kernel with
  ``ctx = DeviceContext.initialize(context_tensor, rank, world_size)`` from ``shmem.get_device_context()``,
  then ``ctx.load(ptr, from_rank)``, ``ctx.store(ptr, value, to_rank)``, ``ctx.get``, ``ctx.put``,
  ``ctx.copy`` and ``ctx.atomic_*(ptr, ..., to_rank, sem=, scope=)``: the rank and the heap bases travel
  inside it. The context tensor is ``[rank, world_size, heap_base_0 .. heap_base_W-1]`` (int64).
- ``ctx.tracing`` (Iris's device-side tracing): ``DeviceContext.initialize(..., tracing=True)`` and
  ``handle = ctx.tracing.record_event_start(event_id=TraceEvent().put, target_rank=, address=, pid_m=, pid_n=,
  mask=)`` / ``ctx.tracing.record_event_end(handle)`` append events to the buffer ``shmem.tracing.enable()`` made
  (``tracing.py`` exports them; gemmar's ``gantt`` draws them). With ``tracing=False`` the calls compile away.
- the tile collectives, as methods: ``ctx.all_reduce_atomic(tile, dst_view)``, ``all_reduce_spinlock``,
  ``all_reduce_one_shot``, ``all_reduce_two_shot``, ``all_reduce_ring``, ``all_gather``, ``gather``,
  ``all_to_all``, ``reduce_scatter`` (``tiles.py``: ``Tile``, ``TileView``, ``make_tensor_view``).
- ``read_realtime`` (gemmar's ``now()``: ns, so ``iris.hip.get_wall_clock_rate`` is 1e6 kHz), ``get_cu_id``
  (the program id: there is no SM id to read under the interpreter) and ``get_xcc_id`` (0: one die).

Why a helper around Triton's ``aggregate``: the interpreter's ``triton.jit`` makes an ``InterpretedFunction``,
which ``aggregate`` does not count as a method, so under the interpreter an aggregate loses every jit method
(``DeviceContext.initialize`` raised "type object has no attribute 'initialize'" on Triton 3.9).
:func:`~gemmar.kernels.triton_support.device_aggregate` puts them back; compiled, the class is Triton's aggregate
unchanged.
"""

import triton
import triton.language as tl

from ..analysis.iris_trace import EVENT_IDS
from ..analysis.iris_trace import EVENT_WORDS as _EVENT_WORDS
from ..kernels.triton_support import device_aggregate
from . import tiles
from ..kernels.device import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or,
                              atomic_sub, atomic_xchg, atomic_xor, copy, get, load, now, put, store, translate)

# Reports (the sanitizer's, a bad rank's) name the kernel line that called this module, not a line of it.
REPORTS_NAME_THE_LINE_THAT_CALLS_THIS_MODULE = True

__all__ = ["DeviceContext", "Context", "DeviceTracing", "TraceEvent", "read_realtime", "get_cu_id", "get_xcc_id", "translate", "load", "store",
           "copy", "get", "put", "atomic_add", "atomic_sub", "atomic_cas", "atomic_xchg", "atomic_min", "atomic_max",
           "atomic_and", "atomic_or", "atomic_xor"]


@triton.jit
def read_realtime():
    """A timestamp in ns (gemmar's ``now()``); Iris's reads AMD's 100 MHz clock, hence its rate of 1e6 kHz here."""
    return now()


@triton.jit
def get_cu_id():
    """The program id: which SM a program runs on is not a thing the interpreter has."""
    return tl.program_id(0)


@triton.jit
def get_xcc_id():
    """0: NVIDIA GPUs and the CPU are one die."""
    return tl.full((), 0, tl.int32)


EVENT_WORDS = tl.constexpr(_EVENT_WORDS)   # (a kernel reads only constexpr globals)


def _name_events(self):
    for name, event_id in EVENT_IDS.items():
        setattr(self, name, tl.constexpr(event_id))


_name_events.__triton_builtin__ = True   # run as Python when a kernel makes one; not a kernel dependency


# Iris's event ids as constexpr attributes, in a kernel (``TraceEvent().put``) and on the host alike. An
# aggregate needs its fields as annotations when it is made, hence the class built from the table.
TraceEvent = device_aggregate(type("TraceEvent", (), {
    "__annotations__": {name: tl.constexpr for name in EVENT_IDS}, "__init__": _name_events,
    "__module__": __name__, "__doc__": "Iris's trace event ids: ``TraceEvent().put == 3``."}))


@device_aggregate
class DeviceTracing:
    """``ctx.tracing`` in a kernel. Each event is :data:`EVENT_WORDS` int64 words of the rank's event buffer
    (``analysis/iris_trace.py`` names them); a program claims a row with an atomic on the event counter, so
    programs never overwrite each other, and counts on past ``max_events`` so the host can say how many it
    lost. Stores are masked rather than branched on, so the same code runs compiled and interpreted."""

    enabled: tl.constexpr
    max_events: tl.tensor
    counters: tl.tensor    # int32 [events claimed, operations numbered]
    events: tl.tensor      # int64 [max_events, EVENT_WORDS]

    @triton.constexpr_function
    def __init__(self, enabled, max_events, counters, events):
        self.enabled = tl.constexpr(enabled)
        self.max_events = max_events
        self.counters = counters
        self.events = events

    @triton.jit
    def record_event_start(self, event_id: tl.constexpr, target_rank, address, pid_m, pid_n, mask=None):
        """Start an event; returns the handle ``record_event_end`` takes. ``address`` (a pointer or a block of
        them) is kept as its lowest address, and the payload in bytes is the number of true ``mask`` elements
        times the element size (0 without a mask)."""
        if not self.enabled:
            return tl.full((), -1, tl.int32)
        start = now()
        index = tl.atomic_add(self.counters, 1)
        operation = tl.atomic_add(self.counters + 1, 1)
        # (+ a 1-element block: a lone pointer or mask becomes a block, a block keeps its shape)
        one = tl.zeros((1,), tl.int64)
        lowest = tl.min(tl.ravel(address.to(tl.int64, bitcast=True) + one), axis=0)
        if mask is None:
            payload = tl.zeros((), tl.int64)
        else:
            payload = tl.sum(tl.ravel(mask.to(tl.int64) + one), axis=0) * \
                (address.dtype.element_ty.primitive_bitwidth // 8)
        word = tl.arange(0, 16)
        values = tl.where(word == 0, event_id,
                 tl.where(word == 1, tl.program_id(0),
                 tl.where(word == 2, pid_m,
                 tl.where(word == 3, pid_n,
                 tl.where(word == 4, target_rank,
                 tl.where(word == 5, operation,
                 tl.where(word == 6, lowest,
                 tl.where(word == 7, payload,
                 tl.where(word == 8, start, -1))))))))).to(tl.int64)
        room = tl.where(index < self.max_events, EVENT_WORDS, 0)   # (an & of two masks trips the interpreter)
        tl.store(self.events + index.to(tl.int64) * EVENT_WORDS + word, values, mask=word < room)
        return index

    @triton.jit
    def record_event_end(self, handle):
        """End the event ``handle`` names (its end time; an event never ended stays an instant)."""
        if self.enabled:
            kept = (handle >= 0) & (handle < self.max_events)
            tl.store(self.events + handle.to(tl.int64) * EVENT_WORDS + EVENT_WORDS - 1, now(), mask=kept)


@device_aggregate
class DeviceContext:
    """A rank's view of the symmetric heap inside a kernel: its rank, the world size, every heap's base, and
    ``tracing`` (:class:`DeviceTracing`)."""

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        self.tracing = tracing

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank, world_size, tracing: tl.constexpr = False):
        """From ``shmem.get_device_context()``: ``[rank, world_size, heap bases..., max_events, counters,
        events]``. ``rank`` and ``world_size`` must be constexprs of the kernel. With ``tracing=True`` events
        go to the buffer of ``shmem.tracing.enable()`` (none are kept while it is not enabled: its
        ``max_events`` reads 0 then)."""
        if tracing:
            tail = context_tensor + 2 + world_size
            max_events = tl.load(tail)
            counters = tl.load(tail + 1).to(tl.pointer_type(tl.int32))
            events = tl.load(tail + 2).to(tl.pointer_type(tl.int64))
            device_tracing = DeviceTracing(True, max_events, counters, events)
        else:   # never dereferenced: every record_* returns at once when tracing is off
            device_tracing = DeviceTracing(False, tl.zeros((), tl.int64), context_tensor.to(tl.pointer_type(tl.int32)),
                                           context_tensor)
        return DeviceContext(rank, world_size, context_tensor + 2, device_tracing)

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier=None, volatile=False,
             hint: tl.constexpr = None):
        return load(pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile, hint)

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier=None, hint: tl.constexpr = None):
        store(pointer, value, self.rank, to_rank, self.heap_bases, mask, hint, cache_modifier)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier=None,
            store_cache_modifier=None, hint: tl.constexpr = None):
        get(from_ptr, to_ptr, self.rank, from_rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier=None,
            store_cache_modifier=None, hint: tl.constexpr = None):
        put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None, load_cache_modifier=None,
             store_cache_modifier=None, hint: tl.constexpr = None):
        copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
             store_cache_modifier, hint)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope, hint)

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    # -- Iris's tile collectives (tiles.py says what each does) ------------------------------------------
    @triton.jit
    def all_reduce_atomic(self, tile, dst_view):
        tiles.all_reduce_atomic(self, tile, dst_view)

    @triton.jit
    def all_reduce_spinlock(self, tile, dst_view, locks):
        tiles.all_reduce_spinlock(self, tile, dst_view, locks)

    @triton.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks):
        tiles.all_reduce_one_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks):
        tiles.all_reduce_two_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_reduce_ring(self, tile, src_view, dst_view):
        tiles.all_reduce_ring(self, tile, src_view, dst_view)

    @triton.jit
    def all_gather(self, tile, dst_view, dim: tl.constexpr):
        tiles.all_gather(self, tile, dst_view, dim)

    @triton.jit
    def gather(self, tile, src_view, source_rank: tl.constexpr, hint: tl.constexpr = None):
        return tiles.gather(self, tile, src_view, source_rank, hint)

    @triton.jit
    def all_to_all(self, tile, src_view, dst_view, N_per_rank: tl.constexpr):
        tiles.all_to_all(self, tile, src_view, dst_view, N_per_rank)

    @triton.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks):
        tiles.reduce_scatter(self, tile, src_view, dst_view, locks)


Context = DeviceContext
