"""The one trace schema: what kernels record and how a row of the host's table is built from it. The device
side (``stamp``, ``event``) and the host side (``Trace``) both read it from here. Which kinds an algorithm
records, and how many, its spec says (``kernels/spec.py``: ``phases``, ``events_per_program``).

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
def event(trace, n_events, t_start, kind, tile_id, pid_m, pid_n, step, peer, TRACE_CAPACITY: tl.constexpr):
    """One phase, in one line of a kernel: record ``[t_start, now]`` as an event of ``kind``; returns
    ``(n_events, now)``, so the next phase starts where this one ended::

        n_events, t = event(trace, n_events, t, SEND, tile_id, pid_m, pid_n, step, next_rank, TRACE_CAPACITY)
    """
    t_end = stamp(TRACE_CAPACITY)
    n_events = record(trace, n_events, kind, tile_id, pid_m, pid_n, step, peer, t_start, t_end, TRACE_CAPACITY)
    return n_events, t_end


@triton.jit
def finish_trace(trace_counts, n_events, TRACE_CAPACITY: tl.constexpr):
    if TRACE_CAPACITY > 0:
        tl.store(trace_counts + tl.program_id(0), n_events.to(tl.int64))
