"""The one trace schema: what kernels record, shared by the device side and the host ``Trace``.

Each event is 8 int64 words: ``kind, tile_id, pid_m, pid_n, step, peer, t_start_ns, t_end_ns``. Every
program writes its own region of the rank's trace buffer (no atomics needed) and counts the events it
wanted to write, so the host can report how many did not fit instead of losing them silently.
"""

import triton
import triton.language as tl

from .device import now

EVENT_WORDS = 8
FIELDS = ("kind", "tile", "pid_m", "pid_n", "step", "peer", "t_start", "t_end")

# kind -> (name, phase). Phases colour the Gantt: gemm, wait, comm, reduce, store.
KINDS = {
    1: ("gemm", "gemm"),
    2: ("slot_wait", "wait"),
    3: ("send", "comm"),
    4: ("signal", "comm"),
    5: ("recv_wait", "wait"),
    6: ("reduce", "reduce"),
    7: ("store", "store"),
    8: ("push", "comm"),
}
# The same ids as constexpr globals, the only kind of global a @triton.jit function may read.
GEMM, SLOT_WAIT, SEND, SIGNAL, RECV_WAIT, REDUCE, STORE, PUSH = (tl.constexpr(i) for i in range(1, 9))

# Flags a kernel can wait on, named in DeadlockError.
FLAG_NAMES = {1: "slot_free", 2: "data_ready", 3: "barrier"}
SLOT_FREE_FLAG, DATA_READY_FLAG, BARRIER_FLAG = (tl.constexpr(i) for i in range(1, 4))


@triton.jit
def stamp(TRACE_CAPACITY: tl.constexpr):
    """now() when tracing, else a constant 0 the compiler drops."""
    if TRACE_CAPACITY > 0:
        t = now()
    else:
        t = tl.zeros((), tl.int64)
    return t


@triton.jit
def record(trace, n_events, kind, tile_id, pid_m, pid_n, step, peer, t_start, t_end,
           TRACE_CAPACITY: tl.constexpr):
    """Append one event to this program's region; returns the new count (kept even past capacity)."""
    if TRACE_CAPACITY > 0:
        word = tl.arange(0, 8)
        values = tl.where(word == 0, kind,
                 tl.where(word == 1, tile_id,
                 tl.where(word == 2, pid_m,
                 tl.where(word == 3, pid_n,
                 tl.where(word == 4, step,
                 tl.where(word == 5, peer,
                 tl.where(word == 6, t_start, t_end))))))).to(tl.int64)
        base = trace + (tl.program_id(0).to(tl.int64) * TRACE_CAPACITY + n_events) * 8
        room = tl.where(n_events < TRACE_CAPACITY, 8, 0)  # past capacity: store nothing, count on
        tl.store(base + word, values, mask=word < room)
    return n_events + 1


@triton.jit
def finish_trace(trace_counts, n_events, TRACE_CAPACITY: tl.constexpr):
    if TRACE_CAPACITY > 0:
        tl.store(trace_counts + tl.program_id(0), n_events.to(tl.int64))
