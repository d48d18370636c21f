"""The one trace schema: what kernels record, how much room it takes, and how a row of the host's table is
built from it. The device side (``stamp``, ``record``) and the host side (``Trace``) both read it from here.

Each event is 8 int64 words: ``kind, tile, pid_m, pid_n, step, peer, t_start_ns, t_end_ns``. Every
program writes its own region of the rank's trace buffer (no atomics needed) and counts the events it
wanted to write, so the host can report how many did not fit instead of losing them silently. On the host
a row is those 8 words with ``rank, iteration, program`` in front (:data:`COLUMNS`).
"""

import numpy as np
import triton
import triton.language as tl

from .device import now

RECORDED = ("kind_id", "tile", "pid_m", "pid_n", "step", "peer", "t_start_ns", "t_end_ns")
EVENT_WORDS = len(RECORDED)
COLUMNS = ("rank", "iteration", "program") + RECORDED

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
    9: ("publish", "store"),         # two_shot: a GEMM program stores its partial and tells the owner
    10: ("partial_wait", "wait"),    # two_shot: the owner waits for every rank's partial of a tile
    11: ("broadcast", "comm"),       # two_shot: the owner writes the sum into every rank's C
    12: ("result_wait", "wait"),     # two_shot: a rank waits until every tile one owner (peer) owns is in its C
}
# The kinds each algorithm records (a trace file with others is damaged).
ALGORITHM_KINDS = {"ring": ("gemm", "slot_wait", "send", "signal", "recv_wait", "reduce", "store"),
                   "atomics": ("gemm", "store", "push"),
                   "two_shot": ("gemm", "publish", "partial_wait", "reduce", "broadcast", "result_wait")}
RESULT_WAIT_ID = 12
# The same ids as constexpr globals, the only kind of global a @triton.jit function may read.
(GEMM, SLOT_WAIT, SEND, SIGNAL, RECV_WAIT, REDUCE, STORE, PUSH, PUBLISH, PARTIAL_WAIT, BROADCAST,
 RESULT_WAIT) = (tl.constexpr(i) for i in range(1, 13))
# The event after which a tile holds the full sum on a rank, per algorithm (replay, tile grid).
# (two_shot: the owner's broadcast writes the tile into every rank's C, so it marks the tile on every rank.)
DONE_KINDS = {"ring": ("store",), "atomics": ("push",), "two_shot": ("broadcast",)}


def owned_tiles(total_tiles, world_size, rank):
    """two_shot: how many tiles rank owns (tile t belongs to rank t % world_size)."""
    return max(0, -(-(total_tiles - rank) // world_size))


def events_per_gemm_tile(algorithm, world_size):
    """Events a GEMM program records per tile it computes."""
    if algorithm == "ring":
        return 2 + 5 * (world_size - 1)   # gemm, store, per step: slot_wait, send, signal, recv_wait, reduce
    if algorithm == "atomics":
        return 2 + world_size             # gemm, zeroing of the next buffer, a push to each rank
    if algorithm == "two_shot":
        return 2                          # gemm, publish
    raise ValueError(f"no event layout for algorithm {algorithm!r}")


def two_shot_reduce_events(owned, world_size, programs):
    """Events two_shot's communication programs record: partial_wait, reduce and broadcast per owned tile
    (shared out over ``programs`` of them), and a result_wait per other owner (by the last one)."""
    return 3 * -(-owned // programs) + world_size - 1


def events_per_program(algorithm, world_size, total_tiles, num_sms, comm_sms=0):
    """Trace room (events) each program gets, enough for the busiest one, reserved up front."""
    room = -(-total_tiles // num_sms) * events_per_gemm_tile(algorithm, world_size)
    if algorithm == "two_shot":
        room = max([room] + [two_shot_reduce_events(owned_tiles(total_tiles, world_size, r), world_size, comm_sms)
                             for r in range(world_size)])
    return room


def events_per_launch(algorithm, world_size, total_tiles, rank):
    """How many events one rank records in one launch when nothing is dropped."""
    count = total_tiles * events_per_gemm_tile(algorithm, world_size)
    if algorithm == "two_shot":
        count += two_shot_reduce_events(owned_tiles(total_tiles, world_size, rank), world_size, programs=1)
    return count


def rows(buffer, counts, capacity, rank, iteration):
    """One launch's trace buffer ([programs, capacity, EVENT_WORDS] int64) -> table rows in COLUMNS order.

    Returns (rows, dropped): ``dropped`` counts events past a program's capacity (0 unless sizing is wrong).
    """
    buffer = np.asarray(buffer, np.int64).reshape(len(counts), capacity, EVENT_WORDS)
    blocks, dropped = [np.zeros((0, len(COLUMNS)), np.int64)], 0
    for program, count in enumerate(int(c) for c in counts):
        kept = min(count, capacity)
        dropped += count - kept
        block = np.empty((kept, len(COLUMNS)), np.int64)
        block[:, :3] = (rank, iteration, program)
        block[:, 3:] = buffer[program, :kept]
        blocks.append(block)
    return np.concatenate(blocks), dropped




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
