"""GEMM + all-reduce by a ring with per-tile lock handoff.

Ranks form a ring: rank r sends to ``r + 1`` and receives from ``r - 1``. Each rank has, in its own
heap, one ``ring_buffer`` slot per output tile and two counters per tile:

- ``data_ready[tile]``: how many messages for this tile the previous rank has put in our slot;
- ``slot_free[tile]``:  how many messages for this tile the next rank has taken out of *its* slot.

For each tile a rank does ``world_size - 1`` steps. Step ``s`` of launch ``epoch`` is message number
``msg = epoch * (world_size - 1) + s`` through that slot:

1. wait until ``slot_free[tile] >= msg``: the next rank has read the previous message (write-after-read
   guard; without it a sender that runs ahead overwrites data the receiver has not read yet);
2. store the payload into the next rank's slot;
3. signal: ``data_ready[tile] = msg + 1`` on the next rank, with *release* semantics, after a block-wide
   barrier, so the flag can never be seen before the data;
4. wait until our own ``data_ready[tile] >= msg + 1`` (*acquire*), read the slot, and tell the previous
   rank ``slot_free[tile] = msg + 1``;
5. add what we received to our sum, and make *what we received* (not our running sum) the next payload.

The payload of step 0 is our own partial; the payload of step s is the partial of rank ``r - s``, so after
``world_size - 1`` steps each rank has added every other rank's partial exactly once. (Forwarding the
running sum instead counts partials several times: right for two ranks only.)

The counters only ever grow, so back-to-back launches need no reset: launch ``epoch`` simply waits for
larger numbers than launch ``epoch - 1``. Every wait has a watchdog (``timeout_ns``); an expired wait is
reported to the host, which raises DeadlockError naming rank, tile and flag.

Step 5 is :func:`reduce_step`, passed to the kernel as ``REDUCE_STEP`` (and the tile order as
``TILE_COORDS``), so that the notebooks' puzzles can run a participant's own version inside this kernel.

``MISTAKE`` turns on one of the classic bugs for teaching (0 = none): 1 forwards the running sum (the
launcher passes :func:`forward_running_sum` as ``REDUCE_STEP``), 2 skips the slot-free wait, 3 waits for a
message that is never sent (a hang, caught by the watchdog).
"""

import triton
import triton.language as tl

from . import device
from .device import DATA_READY_FLAG, SLOT_FREE_FLAG
from .events import RECV_WAIT, REDUCE, SEND, SIGNAL, SLOT_WAIT, STORE, finish_trace, record, stamp
from .gemm import tile_offsets, traced_gemm_tile

MISTAKES = ("none", "forward_accumulator", "skip_slot_free_wait", "wait_for_missing_message")
NO_MISTAKE, FORWARD_ACCUMULATOR, SKIP_SLOT_FREE_WAIT, WAIT_FOR_MISSING_MESSAGE = (tl.constexpr(i) for i in range(4))


@triton.jit
def reduce_step(total, received):
    """Step 5: add what arrived to our sum, and pass on what arrived (the partial of one more rank back
    along the ring). Returns (total, next payload)."""
    return total + received, received


@triton.jit
def forward_running_sum(total, received):
    """Mistake 1: pass on the running sum. From three ranks on, partials are counted several times."""
    total = total + received
    return total, total


@triton.jit(do_not_specialize=["rank", "epoch", "timeout_ns"])
def gemm_all_reduce_ring(
        A, B, C, ring_buffer, data_ready, slot_free, watchdog, heap_bases, rank, world_size, epoch,
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, timeout_ns,
        trace, trace_counts,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr,
        MISTAKE: tl.constexpr, SLOT_CACHE: tl.constexpr, EVEN_K: tl.constexpr,
        TMA: tl.constexpr, TILE_COORDS: tl.constexpr, REDUCE_STEP: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    next_rank = (rank + 1) % world_size
    prev_rank = (rank + world_size - 1) % world_size
    # A slot is a dense BLOCK_M x BLOCK_N fp32 tile; edge tiles carry padding that is never stored in C.
    slot_offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    n_events = tl.zeros((), tl.int32)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_SMS):
        acc, pid_m, pid_n, n_events = traced_gemm_tile(
            A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_id, num_pid_m, num_pid_n, trace,
            n_events, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY,
            TILE_COORDS)

        slot = ring_buffer + tile_id * (BLOCK_M * BLOCK_N) + slot_offsets
        total = acc
        payload = acc
        for step in range(world_size - 1):
            msg = epoch * (world_size - 1) + step

            # 1. Wait until the next rank has emptied its slot of the previous message.
            t_wait = stamp(TRACE_CAPACITY)
            if MISTAKE != SKIP_SLOT_FREE_WAIT:
                device.wait_at_least(slot_free + tile_id, msg, timeout_ns, watchdog, rank, tile_id,
                                     SLOT_FREE_FLAG, tile_id)
            t_send = stamp(TRACE_CAPACITY)
            n_events = record(trace, n_events, SLOT_WAIT, tile_id, pid_m, pid_n, step, next_rank, t_wait, t_send,
                              TRACE_CAPACITY)

            # 2. Put the payload in the next rank's slot.  3. Release-signal that it is there.
            device.store(slot, payload, rank, next_rank, heap_bases)
            t_signal = stamp(TRACE_CAPACITY)
            n_events = record(trace, n_events, SEND, tile_id, pid_m, pid_n, step, next_rank, t_send, t_signal,
                              TRACE_CAPACITY)
            device.signal(data_ready + tile_id, msg + 1, rank, next_rank, heap_bases)
            t_recv = stamp(TRACE_CAPACITY)
            n_events = record(trace, n_events, SIGNAL, tile_id, pid_m, pid_n, step, next_rank, t_signal, t_recv,
                              TRACE_CAPACITY)

            # 4. Acquire-wait for the previous rank's message, read it, hand the slot back.
            expected = msg + 1
            if MISTAKE == WAIT_FOR_MISSING_MESSAGE:
                expected = msg + 2
            device.wait_at_least(data_ready + tile_id, expected, timeout_ns, watchdog, rank, tile_id,
                                 DATA_READY_FLAG, tile_id)
            tl.debug_barrier()  # every thread reads the slot only after the acquire above
            t_reduce = stamp(TRACE_CAPACITY)
            n_events = record(trace, n_events, RECV_WAIT, tile_id, pid_m, pid_n, step, prev_rank, t_recv, t_reduce,
                              TRACE_CAPACITY)
            received = tl.load(slot, cache_modifier=SLOT_CACHE)
            device.signal(slot_free + tile_id, msg + 1, rank, prev_rank, heap_bases)

            # 5. Reduce, and forward what we received (not our sum).
            total, payload = REDUCE_STEP(total, received)
            n_events = record(trace, n_events, REDUCE, tile_id, pid_m, pid_n, step, prev_rank, t_reduce,
                              stamp(TRACE_CAPACITY), TRACE_CAPACITY)

        t_store = stamp(TRACE_CAPACITY)
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        tl.store(C + offsets, total, mask=mask)
        n_events = record(trace, n_events, STORE, tile_id, pid_m, pid_n, world_size - 1, rank, t_store,
                          stamp(TRACE_CAPACITY), TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)
