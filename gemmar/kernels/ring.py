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
5. ``reduce_step``: from our sum so far and what we received, our new sum and the next payload.

The payload of step 0 is our own partial. Step 5 decides what travels on, so that after ``world_size - 1``
steps each rank has added every other rank's partial exactly once: how is notebook 3's puzzle, and the
package's own ``reduce_step`` is kept out of this file (``kernels/puzzle_parts.py``).

The counters only ever grow, so back-to-back launches need no reset: launch ``epoch`` simply waits for
larger numbers than launch ``epoch - 1``. Every wait has a watchdog (``timeout_ns``); an expired wait is
reported to the host, which raises DeadlockError naming rank, tile and flag.

Step 5 is :func:`reduce_step`, passed to the kernel as ``REDUCE_STEP`` (and the tile order as
``TILE_COORDS``), so that the notebooks' puzzles can run a participant's own version inside this kernel. The
waits of steps 1 and 4 are parts too (``SLOT_FREE_WAIT``, ``DATA_READY_WAIT``): the classic bugs for teaching
are these parts swapped (``kernels/mistakes.py``): ``forward_accumulator`` passes on the wrong payload,
``skip_slot_free_wait`` skips step 1, ``wait_for_missing_message`` waits in step 4 for a message that is never
sent (a hang, caught by the watchdog).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import device
from .events import event, finish_trace
from .gemm import GEMM_PHASE, STORE, STORE_PHASE, TILE_COORDS_PART, tile_offsets, traced_gemm_tile
from .spec import WAIT_PART, AlgorithmSpec, Done, Launch, Part, Phase
from .puzzle_parts import reduce_step   # (a puzzle's answer: see puzzle_parts.py)
from .mistakes import forward_running_sum, skip_the_wait, wait_one_too_many

PHASES = (GEMM_PHASE,
          Phase(2, "slot_wait", "wait", "tile {tile} step {step} waits for slot_free (rank {peer} must read its slot)"),
          Phase(3, "send", "comm"), Phase(4, "signal", "comm"),
          Phase(5, "recv_wait", "wait", "tile {tile} step {step} waits for data_ready (rank {peer} sends)"),
          Phase(6, "reduce", "reduce"), STORE_PHASE)
SLOT_WAIT, SEND, SIGNAL, RECV_WAIT, REDUCE = (tl.constexpr(p.kind_id) for p in PHASES[1:6])
WAIT_FLAGS = {"slot_free": 1, "data_ready": 2}   # the ids its waits pass to wait_at_least
SLOT_FREE_FLAG, DATA_READY_FLAG = tl.constexpr(WAIT_FLAGS["slot_free"]), tl.constexpr(WAIT_FLAGS["data_ready"])


@triton.jit(do_not_specialize=["rank", "epoch", "timeout_ns"])
def gemm_all_reduce_ring(
        # this rank's K-slices of A and B; the output, the ring's slots and flags, on the symmetric heap
        A, B, C, ring_buffer, data_ready, slot_free, watchdog, heap_bases,
        # who and which launch
        rank, world_size, epoch,
        # the GEMM's shape and strides; how long a wait may take
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, timeout_ns,
        # the trace buffer
        trace, trace_counts,
        # the GEMM's tiles and programs, and how it computes a tile
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr,
        EVEN_K: tl.constexpr, TMA: tl.constexpr,
        # how a slot is read (its cache modifier)
        SLOT_CACHE: tl.constexpr,
        # parts: the tile order (notebook 1's puzzle), step 5 (notebook 3's), the waits of steps 1 and 4
        TILE_COORDS: tl.constexpr, REDUCE_STEP: tl.constexpr, SLOT_FREE_WAIT: tl.constexpr,
        DATA_READY_WAIT: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    next_rank = (rank + 1) % world_size
    prev_rank = (rank + world_size - 1) % world_size
    # A slot is a dense BLOCK_M x BLOCK_N fp32 tile; edge tiles carry padding that is never stored in C.
    slot_offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see gemm.traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_SMS):
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, TILE_COORDS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M,
                                                           DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY)
        slot = ring_buffer + tile_id * (BLOCK_M * BLOCK_N) + slot_offsets
        total = acc
        payload = acc
        for step in range(world_size - 1):
            msg = epoch * (world_size - 1) + step
            # 1. Wait until the next rank has emptied its slot of the previous message.
            SLOT_FREE_WAIT(slot_free + tile_id, msg, timeout_ns, watchdog, rank, tile_id, SLOT_FREE_FLAG)
            n_events, t = event(trace, n_events, t, SLOT_WAIT, tile_id, pid_m, pid_n, step, next_rank, TRACE_CAPACITY)
            # 2. Put the payload in the next rank's slot.
            device.store(slot, payload, rank, next_rank, heap_bases)
            n_events, t = event(trace, n_events, t, SEND, tile_id, pid_m, pid_n, step, next_rank, TRACE_CAPACITY)
            # 3. Release-signal that it is there.
            device.signal(data_ready + tile_id, msg + 1, rank, next_rank, heap_bases)
            n_events, t = event(trace, n_events, t, SIGNAL, tile_id, pid_m, pid_n, step, next_rank, TRACE_CAPACITY)
            # 4. Acquire-wait for the previous rank's message, read it, hand the slot back.
            DATA_READY_WAIT(data_ready + tile_id, msg + 1, timeout_ns, watchdog, rank, tile_id, DATA_READY_FLAG)
            tl.debug_barrier()  # every thread reads the slot only after the acquire above
            n_events, t = event(trace, n_events, t, RECV_WAIT, tile_id, pid_m, pid_n, step, prev_rank, TRACE_CAPACITY)
            received = tl.load(slot, cache_modifier=SLOT_CACHE)
            device.signal(slot_free + tile_id, msg + 1, rank, prev_rank, heap_bases)
            # 5. Our new sum, and what the next rank receives at the next step.
            total, payload = REDUCE_STEP(total, received)
            n_events, t = event(trace, n_events, t, REDUCE, tile_id, pid_m, pid_n, step, prev_rank, TRACE_CAPACITY)
        # 6. Our C holds the full sum.
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        tl.store(C + offsets, total, mask=mask)
        n_events, t = event(trace, n_events, t, STORE, tile_id, pid_m, pid_n, world_size - 1, rank, TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


# -- the spec --------------------------------------------------------------------------------------------
@dataclass
class RingBuffers:
    C: object            # M x N fp32: each rank's sum, stored by its own programs
    ring_buffer: object  # one BLOCK_M x BLOCK_N fp32 slot per tile: what the previous rank sent
    data_ready: object   # per tile: messages the previous rank has put in our slot
    slot_free: object    # per tile: messages the next rank has taken out of its slot


def buffers(alloc, config, world_size):
    tiles = config.tile_count
    return RingBuffers(C=alloc((config.m, config.n), torch.float32),
                       ring_buffer=alloc((tiles, config.BLK_M * config.BLK_N), torch.float32),
                       data_ready=alloc(tiles, torch.int32), slot_free=alloc(tiles, torch.int32))


def launches(ctx):
    cfg, buf = ctx.config, ctx.buffers
    return [Launch(gemm_all_reduce_ring, (cfg.num_sms,), ctx.tuning(
        A=ctx.A, B=ctx.B, C=buf.C, ring_buffer=buf.ring_buffer, data_ready=buf.data_ready, slot_free=buf.slot_free,
        watchdog=ctx.watchdog, heap_bases=ctx.heap.heap_bases, rank=ctx.rank, world_size=ctx.world_size, epoch=0,
        M=cfg.m, N=cfg.n, K=ctx.K, **ctx.strides, stride_cm=cfg.n, stride_cn=1, timeout_ns=ctx.timeout_ns,
        trace=ctx.trace, trace_counts=ctx.trace_counts, **ctx.gemm, SLOT_CACHE=ctx.peer_cache,
        TILE_COORDS=ctx.parts["tile_coords"], REDUCE_STEP=ctx.parts["reduce_step"],
        SLOT_FREE_WAIT=ctx.parts["slot_free_wait"], DATA_READY_WAIT=ctx.parts["data_ready_wait"]),
        per_launch=("epoch",))]


def events_per_tile(world_size):
    return 2 + 5 * (world_size - 1)   # gemm, store, and per step: slot_wait, send, signal, recv_wait, reduce


SPEC = AlgorithmSpec(
    name="ring", summary="each finished tile travels around the ring of ranks, handed over slot by slot with "
                         "per-tile flags",
    buffers=buffers, launches=launches, output=lambda buffers, epoch: buffers.C, phases=PHASES,
    done=Done("store"), flags={"data_ready": "signal", "slot_free": "reduce"}, wait_flags=WAIT_FLAGS,
    events_per_program=lambda cfg, W: -(-cfg.tile_count // cfg.num_sms) * events_per_tile(W),
    events_per_launch=lambda cfg, W, rank: cfg.tile_count * events_per_tile(W),
    parts={"tile_coords": TILE_COORDS_PART, "reduce_step": Part(reduce_step, "(total, payload)"),
           "slot_free_wait": WAIT_PART, "data_ready_wait": WAIT_PART},
    mistake_parts={"forward_accumulator": {"reduce_step": forward_running_sum},
                   "skip_slot_free_wait": {"slot_free_wait": skip_the_wait},
                   "wait_for_missing_message": {"data_ready_wait": wait_one_too_many}},
    gpu_tuning={"hopper": (128, 128, 64, 8, 4, 8)},   # measured as atomics' (docs/decisions.md, atomics' tile)
    builtin=True)
