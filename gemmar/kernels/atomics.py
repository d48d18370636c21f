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

import triton
import triton.language as tl

from . import device
from .events import PUSH, STORE, finish_trace, record, stamp
from .gemm import tile_offsets, traced_gemm_tile


@triton.jit
def push_partial(C_tile, acc, mask, step, rank, world_size, heap_bases):
    """Push ``step`` (0 .. world_size - 1) of a finished partial tile: add it into one rank's C, and return
    that rank. Step s goes to rank + 1 + s, so at any moment the ranks are writing to different peers
    rather than all to rank 0, and after world_size steps every rank (this one last) has it once."""
    peer = (rank + 1 + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer


@triton.jit(do_not_specialize=["rank", "parity"])
def gemm_all_reduce_atomics(
        A, B, C_pair, heap_bases, rank, world_size, parity,
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        trace, trace_counts,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr,
        EVEN_K: tl.constexpr, TMA: tl.constexpr, TILE_COORDS: tl.constexpr, PUSH_PARTIAL: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # C_pair is [2, M, N]. tl.cast, not M.to(): Triton compiles M == 1 as a constant, a Python int.
    plane = tl.cast(M, tl.int64) * N
    C = C_pair + parity * plane
    C_next = C_pair + (1 - parity) * plane
    n_events = tl.zeros((), tl.int32)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_SMS):
        acc, pid_m, pid_n, n_events = traced_gemm_tile(
            A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_id, num_pid_m, num_pid_n, trace,
            n_events, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY,
            TILE_COORDS)
        t1 = stamp(TRACE_CAPACITY)
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)

        # Ready the next launch's output: this tile of our own C_next, which no rank touches this launch.
        tl.store(C_next + offsets, tl.zeros((BLOCK_M, BLOCK_N), tl.float32), mask=mask)
        t2 = stamp(TRACE_CAPACITY)
        n_events = record(trace, n_events, STORE, tile_id, pid_m, pid_n, 0, rank, t1, t2, TRACE_CAPACITY)

        # Push the partial into every rank's C, one rank per step.
        for step in range(world_size):
            t_push = stamp(TRACE_CAPACITY)
            peer = PUSH_PARTIAL(C + offsets, acc, mask, step, rank, world_size, heap_bases)
            n_events = record(trace, n_events, PUSH, tile_id, pid_m, pid_n, step, peer, t_push,
                              stamp(TRACE_CAPACITY), TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)
