"""GEMM + all-reduce by remote atomics.

Every rank holds a K-slice of A and B and computes a partial tile ``acc`` of ``C = sum_r A_r @ B_r``.
As soon as a tile is done, the rank adds it into *every* rank's copy of C with fp32 atomic adds through
the symmetric heap. No flags, no waiting: the reduction of one tile overlaps the GEMM of the next, and
the sum is complete when every rank's kernel has ended and the ranks have met at a barrier.

Atomic adds need C to start at zero. Zeroing it from the host before each launch costs a pass over C and
a barrier, and forgetting it silently doubles the result (Iris's benchmark zeroed C once and then timed
garbage). Here C is a pair of buffers used by alternate launches: launch ``i`` adds into ``C[i % 2]``
and, for each of its tiles, zeroes the same tile of its *own* ``C[(i + 1) % 2]``, ready for launch
``i + 1``. Nobody adds into that buffer until every rank has passed the barrier that ends launch ``i``.
Read launch ``i``'s result before launch ``i + 1`` starts (it zeroes that buffer for launch ``i + 2``).

The partial stays fp32 all the way into the atomic add: rounding it to fp16 first would accumulate
across ranks in fp16.

One push is :func:`push_partial`, passed to the kernel as ``PUSH_PARTIAL`` so that notebook 2's puzzle can
run a participant's own version of it inside this kernel (and ``TILE_COORDS`` likewise for notebook 1's).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .events import event, finish_trace
from .gemm import GEMM_PHASE, STORE, STORE_PHASE, TILE_COORDS_PART, tile_offsets, traced_gemm_tile
from .spec import AlgorithmSpec, Done, Launch, Part, Phase
from .puzzle_parts import push_partial   # (a puzzle's answer: see puzzle_parts.py)

PUSH_PHASE = Phase(8, "push", "comm")
PUSH = tl.constexpr(PUSH_PHASE.kind_id)


@triton.jit(do_not_specialize=["rank", "parity"])
def gemm_all_reduce_atomics(
        # this rank's K-slices of A and B; the pair of C buffers, on the symmetric heap
        A, B, C_pair, heap_bases,
        # who, and which of the pair this launch adds into
        rank, world_size, parity,
        # the GEMM's shape and strides
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        # the trace buffer
        trace, trace_counts,
        # the GEMM's tiles and programs, and how it computes a tile
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr,
        EVEN_K: tl.constexpr, TMA: tl.constexpr,
        # parts: the tile order (notebook 1's puzzle) and one push (notebook 2's)
        TILE_COORDS: tl.constexpr, PUSH_PARTIAL: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # C_pair is [2, M, N]. tl.cast, not M.to(): Triton compiles M == 1 as a constant, a Python int.
    plane = tl.cast(M, tl.int64) * N
    C = C_pair + parity * plane
    C_next = C_pair + (1 - parity) * plane
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see gemm.traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_SMS):
        # 1. This rank's partial of the tile.
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, TILE_COORDS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M,
                                                           DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY)
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        # 2. Ready the next launch's output: this tile of our own C_next, which no rank touches this launch.
        tl.store(C_next + offsets, tl.zeros((BLOCK_M, BLOCK_N), tl.float32), mask=mask)
        n_events, t = event(trace, n_events, t, STORE, tile_id, pid_m, pid_n, 0, rank, TRACE_CAPACITY)
        # 3. Push the partial into every rank's C, one rank per step.
        for step in range(world_size):
            peer = PUSH_PARTIAL(C + offsets, acc, mask, step, rank, world_size, heap_bases)
            n_events, t = event(trace, n_events, t, PUSH, tile_id, pid_m, pid_n, step, peer, TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


# -- the spec: what the launcher, the trace and the figures need to know of this algorithm -----------------
@dataclass
class AtomicsBuffers:
    C_pair: object      # [2, M, N] fp32: launch i adds into C_pair[i % 2] and zeroes C_pair[(i + 1) % 2]


def buffers(alloc, config, world_size):
    return AtomicsBuffers(C_pair=alloc((2, config.m, config.n), torch.float32))


def launches(ctx):
    cfg = ctx.config
    return [Launch(gemm_all_reduce_atomics, (cfg.num_sms,), ctx.tuning(
        A=ctx.A, B=ctx.B, C_pair=ctx.buffers.C_pair, heap_bases=ctx.heap.heap_bases, rank=ctx.rank,
        world_size=ctx.world_size, parity=0, M=cfg.m, N=cfg.n, K=ctx.K, **ctx.strides, stride_cm=cfg.n,
        stride_cn=1, trace=ctx.trace, trace_counts=ctx.trace_counts, **ctx.gemm,
        TILE_COORDS=ctx.parts["tile_coords"], PUSH_PARTIAL=ctx.parts["push_partial"]), per_launch=("parity",))]


def events_per_tile(world_size):
    return 2 + world_size   # gemm, zeroing the next launch's tile, a push to each rank


SPEC = AlgorithmSpec(
    name="atomics", summary="each finished partial tile is pushed into every rank's C with remote fp32 atomic adds",
    buffers=buffers, launches=launches, output=lambda buffers, epoch: buffers.C_pair[epoch % 2],
    phases=(GEMM_PHASE, STORE_PHASE, PUSH_PHASE), labels={"store": "zeroing the next launch's C"},
    done=Done("push", where="peer"),
    events_per_program=lambda cfg, W: -(-cfg.tile_count // cfg.num_sms) * events_per_tile(W),
    events_per_launch=lambda cfg, W, rank: cfg.tile_count * events_per_tile(W),
    parts={"tile_coords": TILE_COORDS_PART, "push_partial": Part(push_partial, "the rank pushed to")},
    barrier_after_launch=True,
    # the fastest of a measured sweep at the large shapes (docs/decisions.md, atomics' tile)
    gpu_tuning={"hopper": (128, 128, 64, 8, 4, 8)},
    builtin=True)
