"""GEMM + all-reduce, two-shot by tile owner: the GEMM programs never wait, a few programs do the reduction.

Every rank computes a partial of every output tile (its K-slice). Tile ``t`` is *owned* by rank
``t % world_size``; the owner sums the tile's partials from all ranks and hands the sum back to every rank.
That is a reduce-scatter followed by an all-gather, one tile at a time, which moves each element over the
links ``2 (W - 1) / W`` times in the wire dtype, as NCCL's ring all-reduce does.

A launch is two kernels, which run at the same time on two streams of the rank (one after the other under
the interpreter, the GEMM first). Two kernels rather than one with two kinds of programs, so that each is
compiled for its own job: the GEMM with its software pipeline and the tile's warps and stages, the
reduction without either.

- **GEMM programs** (``two_shot_gemm``, ``NUM_SMS`` of them), the persistent GEMM: for each tile
  ``pid, pid + NUM_SMS, ...``

  1. compute the partial tile (fp32 accumulator);
  2. store it into ``partials[tile]`` on this rank's *own* heap, in the wire dtype (the input dtype by
     default: half the bytes of fp32);
  3. release-add 1 to ``partial_ready[tile]`` in the owner's heap, after a block-wide barrier so the
     count can never be seen before the data. Then go straight on to the next tile: nothing to wait for.

- **communication programs** (``two_shot_reduce``, ``COMM_SMS`` of them), for the tiles this rank owns:

  4. acquire-wait until ``partial_ready[tile] >= W * (epoch + 1)``: every rank has published launch
     ``epoch``'s partial (the counter only grows, by W per launch, so no host reset is ever needed);
  5. read the W partials - rank 0's, then rank 1's, ... - and add them in fp32. The order is fixed, so
     every rank gets the same bits, and the same inputs give the same C run after run;
  6. write the sum, in C's dtype, into C on every rank, then (one block barrier, then a release-add per
     peer) add 1 to ``results_in[rank]`` in each peer's heap: how many of this owner's tiles have reached
     that peer's C, counted over every launch;

  and then the last communication program, for each other owner ``q``:

  7. acquire-wait until ``results_in[q] >= owned(q) * (epoch + 1)``: every tile ``q`` owns has reached
     this rank's C, so the launch ends only when C is complete. That is ``W - 1`` waits, not one per tile:
     waiting for each tile's flag in turn, one program took 647 us (25 % of the launch) at W = 2 on an
     H200, ~0.63 us per flag, for flags set long before.

Why back-to-back launches are safe without a barrier: a rank's GEMM of launch ``e + 1`` starts only after
its reduction of launch ``e`` has ended (the launcher orders the two streams so), i.e. after every owner
has written every tile into its C (step 7), which every owner does only after reading all of launch
``e``'s partials (step 5). ``results_in`` grows by ``owned(q)`` per launch, so it needs no reset either. So when a rank overwrites ``partials`` in launch ``e + 1``, nobody still needs
launch ``e``'s.

Why it cannot deadlock on a GPU: GEMM programs wait for nothing, so they always finish; communication
programs only wait for GEMM programs (of any rank) and for owners' communication programs. Under the
Triton interpreter each rank's GEMM kernel has run to the end before its reduction starts.

``MISTAKE`` turns on a teaching bug: 1 reads the partials without waiting for ``partial_ready``, so a
late rank's partial is read before it is written. Step 5 is :func:`sum_partials`, passed to the reduction
kernel as ``SUM_PARTIALS`` so that notebook 6's puzzle can run a participant's own version of it.
"""

import triton
import triton.language as tl

from . import device
from .device import FLAG_STRIDE, PARTIAL_READY_FLAG, RESULTS_IN_FLAG
from .events import BROADCAST, PARTIAL_WAIT, PUBLISH, REDUCE, RESULT_WAIT, finish_trace, record, stamp
from .gemm import tile_coords, tile_offsets, traced_gemm_tile

MISTAKES = ("none", "skip_partial_wait")
NO_MISTAKE, SKIP_PARTIAL_WAIT = (tl.constexpr(i) for i in range(2))


@triton.jit
def slot_pointers(partials, tile_id, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where tile ``tile_id``'s partial lives: a dense BLOCK_M x BLOCK_N slot (edge tiles carry padding that
    is never stored in C). Built from the tile id each time, like C's offsets: a 2-D offset tensor made once
    outside the tile loop would stay live in registers beside the accumulator and push the GEMM into
    spilling (that measured three times slower on an H200)."""
    rows = tl.cast(tile_id, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    return partials + rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]


@triton.jit
def sum_partials(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    """Step 5: the owner's fp32 sum of every rank's partial of one tile (``slot``: the tile's slot in this
    rank's heap), read in rank order, so that the same inputs always give the same bits."""
    total = tl.zeros(slot.shape, tl.float32)
    for source in range(world_size):
        total += tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE).to(tl.float32)
    return total


@triton.jit
def two_shot_gemm(
        A, B, partials, partial_ready, heap_bases, rank, world_size, M, N, K, stride_am, stride_ak, stride_bk,
        stride_bn, trace, trace_counts,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr, EVEN_K: tl.constexpr,
        TMA: tl.constexpr):
    """The GEMM programs: compute each tile, publish it, move on (steps 1-3).

    The tile loop is a plain loop, not ``tl.range(..., flatten=True)``: with the publishing epilogue (a
    block barrier and an atomic) inside a flattened loop, Triton 3.6-3.9 gives up software-pipelining the
    K loop altogether (one shared-memory stage instead of three; ``tests/test_compile.py`` checks), and the
    GEMM ran three times slower on an H200."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    n_events = tl.zeros((), tl.int32)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_SMS):
        acc, pid_m, pid_n, n_events = traced_gemm_tile(
            A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_id, num_pid_m, num_pid_n, trace,
            n_events, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY,
            tile_coords)
        t_publish = stamp(TRACE_CAPACITY)
        owner = tile_id % world_size
        # 2. Our partial of this tile, into our own heap.
        tl.store(slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N), acc.to(partials.dtype.element_ty))
        # 3. Count it in at the owner: release, after every thread's store.
        tl.debug_barrier()
        device.atomic_add(partial_ready + tile_id, 1, rank, owner, heap_bases, sem="release", scope="sys")
        n_events = record(trace, n_events, PUBLISH, tile_id, pid_m, pid_n, 0, owner, t_publish,
                          stamp(TRACE_CAPACITY), TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit(do_not_specialize=["rank", "epoch", "timeout_ns"])
def two_shot_reduce(
        C, partials, partial_ready, results_in, watchdog, heap_bases, rank, world_size, epoch, M, N,
        stride_cm, stride_cn, timeout_ns, trace, trace_counts,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr, COMM_SMS: tl.constexpr,
        TRACE_CAPACITY: tl.constexpr, MISTAKE: tl.constexpr, PEER_CACHE: tl.constexpr,
        SUM_PARTIALS: tl.constexpr):
    """The communication programs: reduce the tiles this rank owns, then wait for the others (steps 4-7).
    ``trace`` and ``trace_counts`` start at this kernel's own region of the rank's trace buffer.
    ``results_in`` holds one counter per owner, ``FLAG_STRIDE`` int32s apart (a cache line each)."""
    c = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total_tiles = num_pid_m * num_pid_n
    n_events = tl.zeros((), tl.int32)
    owned = tl.maximum(total_tiles - rank + world_size - 1, 0) // world_size
    for j in range(c, owned, COMM_SMS):
        tile_id = rank + j * world_size
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        # 4. Every rank's partial of launch `epoch` is in.
        t_wait = stamp(TRACE_CAPACITY)
        if MISTAKE != SKIP_PARTIAL_WAIT:
            device.wait_at_least(partial_ready + tile_id, world_size * (epoch + 1), timeout_ns, watchdog,
                                 rank, tile_id, PARTIAL_READY_FLAG, tile_id)
        tl.debug_barrier()  # every thread reads the partials only after the acquire above
        t_reduce = stamp(TRACE_CAPACITY)
        n_events = record(trace, n_events, PARTIAL_WAIT, tile_id, pid_m, pid_n, 0, -1, t_wait, t_reduce,
                          TRACE_CAPACITY)
        # 5. Sum the partials in rank order, in fp32.
        total = SUM_PARTIALS(slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N), rank, world_size, heap_bases,
                             PEER_CACHE)
        t_send = stamp(TRACE_CAPACITY)
        n_events = record(trace, n_events, REDUCE, tile_id, pid_m, pid_n, 0, -1, t_reduce, t_send,
                          TRACE_CAPACITY)
        # 6. The sum, in C's dtype, into every rank's C (ours first); then count it in at each peer.
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        result = total.to(C.dtype.element_ty)
        for step in range(world_size):
            device.store(C + offsets, result, rank, (rank + step) % world_size, heap_bases, mask=mask)
        tl.debug_barrier()   # every thread's stores are in before the one thread that releases them
        for step in range(1, world_size):
            device.atomic_add(results_in + rank * FLAG_STRIDE, 1, rank, (rank + step) % world_size, heap_bases,
                              sem="release", scope="sys")
        n_events = record(trace, n_events, BROADCAST, tile_id, pid_m, pid_n, 0, -1, t_send,
                          stamp(TRACE_CAPACITY), TRACE_CAPACITY)
    # 7. Every other owner's tiles: the last communication program waits for each owner's count, after its
    # own reductions. (Under the interpreter every reduction of this rank has then run before any of its
    # waits, which is what keeps the ranks from waiting on each other in a circle there.)
    last = c == COMM_SMS - 1
    for step in range(1, tl.where(last, world_size, 1)):
        owner = (rank + step) % world_size
        target = (tl.maximum(total_tiles - owner + world_size - 1, 0) // world_size) * (epoch + 1)
        t_wait = stamp(TRACE_CAPACITY)
        device.wait_at_least(results_in + owner * FLAG_STRIDE, target, timeout_ns, watchdog, rank, -1,
                             RESULTS_IN_FLAG, owner)
        n_events = record(trace, n_events, RESULT_WAIT, -1, -1, -1, 0, owner, t_wait, stamp(TRACE_CAPACITY),
                          TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)
