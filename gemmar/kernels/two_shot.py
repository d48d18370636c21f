"""GEMM + all-reduce, two-shot by tile owner: the GEMM programs never wait, small programs beside them reduce.

Every rank computes a partial of every output tile (its K-slice). Tile ``t`` is *owned* by rank
``t % world_size``; the owner sums the tile's partials from all ranks and hands the sum back to every rank.
That is a reduce-scatter followed by an all-gather, one tile at a time, which moves each element over the
links ``2 (W - 1) / W`` times in the wire dtype, as NCCL's ring all-reduce does.

A launch is two kernels, which run at the same time on two streams of the rank (one after the other under
the interpreter, the GEMM first). Two kernels rather than one with two kinds of programs, so that each is
compiled for its own job: the GEMM with its software pipeline and the tile's warps and stages, the
reduction without either. On Hopper GPUs the reduction's programs are small enough (4 warps, summing
``REDUCE_ROWS`` rows of a tile at a time: 63 registers a thread) to run on the same SMs as the GEMM's, one
beside each: the GEMM keeps every SM, and the reduction streams alongside it (``launch.share_sms`` and
``launch.check_co_resident`` make sure they fit).

- **GEMM programs** (``two_shot_gemm``, ``NUM_SMS`` of them), the persistent GEMM: for each tile
  ``pid, pid + NUM_SMS, ...``

  1. compute the partial tile (fp32 accumulator);
  2. store it into ``partials[tile]`` on this rank's *own* heap, in the wire dtype (the input dtype by
     default: half the bytes of fp32);
  3. release-add 1 to ``partial_ready[tile]`` in the owner's heap, after a block-wide barrier so the
     count can never be seen before the data. Then go straight on to the next tile: nothing to wait for.

  With its own tiles done, and when the communication programs are fewer than the GEMM's (each then an SM
  the GEMM does not have), a GEMM program *helps* (:func:`help_reduce`): it looks at the tiles this rank
  owns, from the last one back, and does steps 5 and 6 for each one whose partials are all in already and
  that no other program has taken (``taken[tile]``, moved from ``epoch`` to ``epoch + 1`` by whoever takes
  the tile, with a compare-and-swap: one program per tile per launch). A tile that is not complete yet it
  leaves alone, so it still never waits.

  At world size 1 a tile's one partial is its sum: the launch is another GEMM kernel alone
  (``one_rank_gemm``), whose programs write each tile straight into C (:func:`write_alone_tile`, steps 2-6
  at once), with no flags and no communication programs. The partial's trip through memory (written, read
  back, written again as C) and the second kernel, whose programs found every tile taken, each cost a
  measurable share of the launch (docs/decisions.md, two_shot at world size 1).

- **communication programs** (``two_shot_reduce``, ``COMM_SMS`` of them), for the tiles this rank owns
  (``c, c + COMM_SMS, ...``):

  4. acquire-wait until ``partial_ready[tile] >= W * (epoch + 1)``: every rank has published launch
     ``epoch``'s partial (the counter only grows, by W per launch, so no host reset is ever needed); then
     take the tile as above, unless a GEMM program has (where GEMM programs may take tiles at all);
  5. read the W partials - rank 0's, then rank 1's, ... - and add them in fp32. The order is fixed, so
     every rank gets the same bits, and the same inputs give the same C run after run;
  6. write the sum, in C's dtype, into C on every rank. After its last tile, each communication program
     adds the number of tiles it wrote (one block barrier, then a release-add per peer) to
     ``results_in[rank]`` in each peer's heap: how many of this owner's tiles have reached that peer's C,
     counted over every launch;

  and then the last communication program, for each other owner ``q``:

  7. acquire-wait until ``results_in[q] >= owned(q) * (epoch + 1)``: every tile ``q`` owns has reached
     this rank's C, so the launch ends only when C is complete. That is ``W - 1`` waits, not one per tile:
     waiting for each tile's flag in turn took a quarter of a launch, for flags set long before
     (docs/decisions.md, step 7's waits).

Why back-to-back launches are safe without a barrier: a rank's GEMM of launch ``e + 1`` starts only after
its reduction of launch ``e`` has ended (the launcher orders the two streams so), i.e. after every owner
has written every tile into its C (step 7), which every owner does only after reading all of launch
``e``'s partials (step 5). So when a rank overwrites ``partials`` in launch ``e + 1``, nobody still needs
launch ``e``'s. ``results_in`` grows by ``owned(q)`` per launch and ``taken`` by 1, so neither needs a reset:
every tile of launch ``e`` has been taken before the reduction of launch ``e`` ends (a communication program
passes over a tile only once someone has taken it), so ``taken[tile]`` is ``e + 1`` when launch ``e + 1``
starts, and a GEMM program of launch ``e`` that looks late finds the tile taken.

Why it cannot deadlock on a GPU: GEMM programs wait for nothing, so they always finish; communication
programs only wait for GEMM programs (of any rank) and for owners' programs. Under the Triton interpreter
each rank's GEMM kernel has run to the end before its reduction starts (its programs one after another:
the later ones find more tiles complete and help more).

**one_shot** (:mod:`gemmar.kernels.one_shot`) is the variant in which every rank sums every tile: its own two
kernels, on these buffers, with this module's launches.

Step 5 is :func:`sum_partials`, passed to both kernels as ``SUM_PARTIALS`` so that notebook 6's puzzle can
run a participant's own version of it. Step 4's wait is a part too (``WAIT_FOR_PARTIALS``): the teaching mistake
``skip_partial_wait`` runs the kernels with it swapped for ``kernels/mistakes.py``'s ``skip_the_wait``, so a
late rank's partial is read before it is written.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import device
from .device import FLAG_WORDS
from ..errors import UsageError
from .events import event, finish_trace, stamp
from .puzzle_parts import sum_partials   # (a puzzle's answer: see puzzle_parts.py)
from .gemm import GEMM, GEMM_PHASE, gemm_tile_steps, tile_coords, tile_offsets, tile_rows_offsets, traced_gemm_tile
from .gemv import row_gemv_steps
from .mistakes import skip_the_wait
from .owner_reduce import (BROADCAST, COMM_WARPS, REDUCE, REDUCE_ROWS, REDUCTION_PHASES, TAKE, WAIT_FLAGS,
                           count_in_at_peers, help_reduce, owned_count_on_host, owned_tiles, reduce_events,
                           slot_pointers, slot_rows, two_shot_reduce)
from .spec import WAIT_PART, AlgorithmSpec, Done, Launch, Part, Phase

# Split-K: the program whose slice of a tile counts in last sums the slices this many rows at a time.
SPLIT_SUM_ROWS = 32

PUBLISH_PHASE = Phase(9, "publish", "store")   # a GEMM program stores its partial and tells the owner
PHASES = (GEMM_PHASE, PUBLISH_PHASE) + REDUCTION_PHASES
PUBLISH = tl.constexpr(PUBLISH_PHASE.kind_id)


@triton.jit(do_not_specialize=["rank", "epoch"])
def two_shot_gemm(
        # this rank's K-slices of A and B; the output, the partials and the flags, on the symmetric heap
        A, B, C, partials, partial_ready, results_in, taken, heap_bases,
        # who and which launch
        rank, world_size, epoch,
        # the GEMM's shape and strides
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        # this kernel's region of the trace buffer
        trace, trace_counts,
        # the GEMM's tiles and programs, and how it computes a tile
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr, EVEN_K: tl.constexpr,
        TMA: tl.constexpr,
        # the reduction the GEMM programs help with: whether they do, step 5's sum (a part), how it runs
        HELP: tl.constexpr, SUM_PARTIALS: tl.constexpr, PEER_CACHE: tl.constexpr, REDUCE_ROWS: tl.constexpr):
    """The GEMM programs: compute each tile, publish it to its owner, move on (steps 1-3); then help with the
    reduction of what is ready (:func:`help_reduce`), still without waiting.

    The tile loop is not flattened with the K loop into one software pipeline (as :func:`one_rank_gemm`'s is):
    with the publishing epilogue (a block barrier and an atomic) inside a flattened loop, Triton 3.6-3.9 gives
    up software-pipelining the K loop altogether (one shared-memory stage instead of three;
    ``tests/test_compile.py`` checks), and the GEMM ran several times slower."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see gemm.traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in tl.range(pid, num_pid_m * num_pid_n, NUM_SMS):
        # 1. Our partial of the tile.
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, tile_coords, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M,
                                                           DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY)
        owner = tile_id % world_size
        # 2. Our partial of this tile, into our own heap.
        tl.store(slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N), acc.to(partials.dtype.element_ty))
        # 3. Count it in at the owner: release, after every thread's store.
        tl.debug_barrier()
        device.atomic_add(partial_ready + tile_id, 1, rank, owner, heap_bases, sem="release", scope="sys")
        n_events, t = event(trace, n_events, t, PUBLISH, tile_id, pid_m, pid_n, 0, owner, TRACE_CAPACITY)
    summed = tl.zeros((), tl.int32)   # tiles this program has written into every rank's C
    if HELP:
        n_events, summed = help_reduce(C, partials, partial_ready, taken, heap_bases, rank, world_size, epoch, M, N,
                                       stride_cm, stride_cn, trace, n_events, pid, BLOCK_M, BLOCK_N, GROUP_SIZE_M,
                                       NUM_SMS, TRACE_CAPACITY, PEER_CACHE, SUM_PARTIALS, REDUCE_ROWS, owned_tiles)
    count_in_at_peers(results_in, summed, rank, world_size, heap_bases)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit
def one_rank_gemm(
        # this rank's A and B (all of K); the output, and the partials (for their dtype, the wire's)
        A, B, C, partials,
        # the GEMM's shape and strides
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        # this kernel's region of the trace buffer
        trace, trace_counts,
        # the GEMM's tiles and programs, and how it computes a tile
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr, EVEN_K: tl.constexpr,
        TMA: tl.constexpr):
    """two_shot and one_shot at world size 1: a tile's one partial is its sum, so each GEMM program writes its
    tiles straight into C (:func:`write_alone_tile`, steps 2-6 at once), and the launch is this kernel alone,
    with no flags and no communication programs. The partial's trip through memory (written, read back,
    written again as C) and the second kernel, whose programs found every tile taken, each cost a measurable
    share of the launch (docs/decisions.md, two_shot at world size 1).

    With tensor descriptors (``TMA``) the tile loop is flattened with the K loop into one software pipeline
    (``tl.range(..., flatten=True)``: the next tile's first loads start while this one's C is stored): the
    GEMM came closer to torch.matmul's time; with plain pointers (few rows) it did not help (docs/decisions.md,
    the flattened loop)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see gemm.traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in tl.range(pid, num_pid_m * num_pid_n, NUM_SMS, flatten=TMA):
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, tile_coords, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M,
                                                           DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY)
        n_events, t = write_alone_tile(acc, C, partials, M, N, stride_cm, stride_cn, trace, n_events, t, tile_id,
                                       pid_m, pid_n, BLOCK_M, BLOCK_N, TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit
def one_rank_split_gemm(
        # this rank's A and B (all of K); the output, the partials (for their dtype); the K shares' fp32 products
        # and a count per cut tile
        A, B, C, partials, slices, slices_in,
        # the GEMM's shape and strides
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        # this kernel's region of the trace buffer
        trace, trace_counts,
        # the GEMM's tiles and programs, how it computes a tile, the tiles before the last wave (not cut), into
        # how many shares each last-wave tile's K is cut, and how many rows the last share's program sums at once
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr, EVEN_K: tl.constexpr,
        TMA: tl.constexpr, WHOLE_TILES: tl.constexpr, SPLIT_K: tl.constexpr, SUM_ROWS: tl.constexpr):
    """:func:`one_rank_gemm` with the K of the last wave's tiles shared out among the programs (split-K, and
    stream-K where the shares fill every program), for shapes whose last wave leaves most SMs idle: fewer tiles
    than SMs and a long K (one row of a decode step at K = 8192: 32-64 tiles for 132 SMs), or a wave and a bit
    (160 tiles on 132: the second wave's 28 tiles take as long as the first's 132).

    The first ``WHOLE_TILES`` tiles run whole, as in :func:`one_rank_gemm`. The K steps of the others, end to
    end (tile by tile), are then cut into ``sharing`` = min(NUM_SMS, cut tiles x SPLIT_K) equal shares, one a
    program (RunConfig.k_shares is the same arithmetic on the host): with SPLIT_K slices a tile that fill
    at most the programs, a share is a tile's slice; with more, a share may end in one tile and go on in the
    next. For each tile its share touches, a program computes that part's fp32 product, stores it in its slot
    (the tile's index among the cut ones + the program's: a slot of its own), and counts it in
    (``slices_in``, a release-acquire add). The program that counts in last sums the tile's parts in program
    order (the same bits every run, whoever is last), writes C and sets the count back to 0 for the next
    launch. Nobody waits, so nothing can hang.

    At world size 1 only: at W >= 2 the partial of a tile is already cut by rank, and the tiles are many."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see gemm.traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in tl.range(pid, WHOLE_TILES, NUM_SMS):
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, tile_coords, BLOCK_M,
                                                           BLOCK_N, BLOCK_K, GROUP_SIZE_M, DOT_PRECISION, EVEN_K,
                                                           TMA, TRACE_CAPACITY)
        n_events, t = write_alone_tile(acc, C, partials, M, N, stride_cm, stride_cn, trace, n_events, t, tile_id,
                                       pid_m, pid_n, BLOCK_M, BLOCK_N, TRACE_CAPACITY)
    steps = tl.cdiv(K, BLOCK_K)
    cut_steps = (num_pid_m * num_pid_n - WHOLE_TILES) * steps   # the last wave's K steps, end to end
    sharing = tl.minimum(NUM_SMS, (num_pid_m * num_pid_n - WHOLE_TILES) * SPLIT_K)
    step = pid * cut_steps // sharing
    end = tl.where(pid < sharing, (pid + 1) * cut_steps // sharing, step)
    while step < end:
        cut = step // steps   # (the tile's index among the cut ones)
        tile_id = WHOLE_TILES + cut
        first_step = step - cut * steps
        end_step = tl.minimum(steps, first_step + end - step)
        # The programs whose shares touch this tile: the one holding its first step, to the one holding its
        # last (the program holding step x is ((x + 1) * sharing - 1) // cut_steps).
        first_part = ((cut * steps + 1) * sharing - 1) // cut_steps
        last_part = ((cut * steps + steps) * sharing - 1) // cut_steps
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        t = stamp(TRACE_CAPACITY)
        acc = gemm_tile_steps(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
                              first_step, end_step, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, EVEN_K, TMA)
        n_events, t = event(trace, n_events, t, GEMM, tile_id, pid_m, pid_n, pid - first_part, -1, TRACE_CAPACITY)
        tl.store(slot_pointers(slices, cut + pid, BLOCK_M, BLOCK_N), acc)
        # Every thread's store before the count (the block barrier), and the count releases them to the program
        # that counts in last, which acquires them with its own add.
        tl.debug_barrier()
        arrived = tl.atomic_add(slices_in + cut, 1, sem="acq_rel", scope="gpu")
        n_events, t = event(trace, n_events, t, PUBLISH, tile_id, pid_m, pid_n, pid - first_part, 0, TRACE_CAPACITY)
        if arrived == last_part - first_part:
            n_events, t = event(trace, n_events, t, TAKE, tile_id, pid_m, pid_n, pid - first_part, -1,
                                TRACE_CAPACITY)
            # SUM_ROWS rows at a time, one part's rows in registers at a time: the whole tile's sum beside a
            # whole slot spilled registers at 128 x 128 and up (docs/decisions.md, split-K).
            sum_slots_into_c(C, partials, slices, cut + first_part, last_part - first_part + 1, pid_m, pid_n, M, N,
                             stride_cm, stride_cn, SUM_ROWS, BLOCK_M, BLOCK_N)
            tl.store(slices_in + cut, 0)
            # (summed and written a chunk at a time: the reduce event covers both, the broadcast is its end)
            n_events, t = event(trace, n_events, t, REDUCE, tile_id, pid_m, pid_n, pid - first_part, -1,
                                TRACE_CAPACITY)
            n_events, t = event(trace, n_events, t, BROADCAST, tile_id, pid_m, pid_n, pid - first_part, -1,
                                TRACE_CAPACITY)
        step += end_step - first_step
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit
def one_rank_gemv(
        # this rank's A and B (all of K); the output, the partials (for their dtype); the shares' fp32 products
        # and a count per column block
        A, B, C, partials, slices, slices_in,
        # the GEMM's shape and strides, and into how many shares each column block's K is cut
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, split_k,
        # this kernel's region of the trace buffer
        trace, trace_counts,
        # the block (BLOCK_M rows: all of M), how a share's product is computed
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
        TRACE_CAPACITY: tl.constexpr, EVEN_K: tl.constexpr, BY_DOT: tl.constexpr):
    """Program ``pid``: column block ``pid // split_k``, K share ``pid % split_k`` (a block's shares are
    neighbours in launch order, so they run at the same time and the last one's sum waits for nobody)."""
    pid = tl.program_id(0)
    pid_n = pid // split_k
    share = pid % split_k
    steps = tl.cdiv(K, BLOCK_K)
    first_step = share * steps // split_k
    end_step = (share + 1) * steps // split_k
    n_events = tl.zeros((), tl.int32)
    t = stamp(TRACE_CAPACITY)
    if BY_DOT:
        acc = gemm_tile_steps(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, 0, pid_n, first_step,
                              end_step, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, EVEN_K, False)
    else:
        tl.static_assert(BLOCK_M == 1, "the multiply-add path computes one row (M = 1)")
        acc = row_gemv_steps(A, B, N, K, stride_ak, stride_bk, stride_bn, pid_n, first_step, end_step, BLOCK_N,
                             BLOCK_K, EVEN_K)
    n_events, t = event(trace, n_events, t, GEMM, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
    if split_k == 1:
        n_events, t = write_alone_tile(acc, C, partials, M, N, stride_cm, stride_cn, trace, n_events, t, pid_n, 0, pid_n,
                                       BLOCK_M, BLOCK_N, TRACE_CAPACITY)
    else:
        tl.store(slot_pointers(slices, pid, BLOCK_M, BLOCK_N), acc)
        # Every thread's store before the count (the block barrier); the count releases them to the program that
        # counts in last, which acquires them with its own add.
        tl.debug_barrier()
        arrived = tl.atomic_add(slices_in + pid_n, 1, sem="acq_rel", scope="gpu")
        n_events, t = event(trace, n_events, t, PUBLISH, pid_n, 0, pid_n, share, 0, TRACE_CAPACITY)
        if arrived == split_k - 1:
            n_events, t = event(trace, n_events, t, TAKE, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
            sum_slots_into_c(C, partials, slices, pid_n * split_k, split_k, 0, pid_n, M, N, stride_cm, stride_cn,
                             BLOCK_M, BLOCK_M, BLOCK_N)
            tl.store(slices_in + pid_n, 0)
            # (summed and written at once: the reduce event covers both, the broadcast is its end)
            n_events, t = event(trace, n_events, t, REDUCE, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
            n_events, t = event(trace, n_events, t, BROADCAST, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit
def sum_slots_into_c(
        # the output, the partials (for their dtype), the slots; the tile's ``parts`` slots from ``first_slot`` on
        C, partials, slices, first_slot, parts,
        # the tile, and C's shape and strides
        pid_m, pid_n, M, N, stride_cm, stride_cn,
        SUM_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """What the program that counts a cut tile in last does (split-K and the few-rows kernel): the tile's slots
    summed in slot order (the same bits whoever is last), ``SUM_ROWS`` rows at a time, and written into C, rounded
    as :func:`write_alone_tile` rounds a whole tile (one C, one rounding)."""
    for first in range(0, BLOCK_M, SUM_ROWS):
        total = tl.zeros((SUM_ROWS, BLOCK_N), dtype=tl.float32)
        for part in range(0, parts):
            # .cg: from L2, where the other programs' stores are, never a stale line of this SM's L1
            total += tl.load(slot_rows(slices, first_slot + part, first, SUM_ROWS, BLOCK_M, BLOCK_N),
                             cache_modifier=".cg")
        offsets, mask = tile_rows_offsets(pid_m, pid_n, first, M, N, stride_cm, stride_cn, SUM_ROWS, BLOCK_M, BLOCK_N)
        tl.store(C + offsets, rounded_as_one_partial(total, partials).to(C.dtype.element_ty), mask=mask)


@triton.jit
def rounded_as_one_partial(total, partials):
    """An fp32 tile rounded through the partials' dtype, then 0 + it (a -0.0 becomes +0.0, as a sum from zero
    does): the bits a communication program's sum of this one partial gives."""
    return total.to(partials.dtype.element_ty).to(tl.float32) + 0.0


@triton.jit
def write_alone_tile(
        # the tile's partial product; the output, and the partials (for their dtype); C's shape and strides
        acc, C, partials, M, N, stride_cm, stride_cn,
        # the trace: its buffer, events so far, the GEMM's end; the tile
        trace, n_events, t, tile_id, pid_m, pid_n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TRACE_CAPACITY: tl.constexpr):
    """Steps 2-6 for a tile at world size 1, in the GEMM program: the tile's one partial is its sum, so it
    goes straight into C instead of through ``partials`` (written, read back and written again as C: at the
    large shapes that round trip cost a sixth of the GEMM's time; docs/decisions.md, two_shot at world size 1).
    Same bits as the communication programs' sum (rounded to the wire dtype, then 0 + it in fp32, then to C's
    dtype). Nobody else reads the tile, so no flag is set.

    Why not for every tile a rank owns at any world size: the GEMM program would then also read the W - 1
    other partials, and that took the 128 x 256 tile's GEMM from 166 registers a thread to 255 with spills
    (ptxas for sm_90), leaving no room for a communication program beside it.

    Records take, reduce, broadcast and publish: as many events as the other path, so that a trace at
    world size 1 shows every step."""
    n_events, t = event(trace, n_events, t, TAKE, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    total = rounded_as_one_partial(acc, partials)
    n_events, t = event(trace, n_events, t, REDUCE, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    tl.store(C + offsets, total.to(C.dtype.element_ty), mask=mask)
    n_events, t = event(trace, n_events, t, BROADCAST, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    return event(trace, n_events, t, PUBLISH, tile_id, pid_m, pid_n, 0, 0, TRACE_CAPACITY)


# -- the spec --------------------------------------------------------------------------------------------
@dataclass
class TwoShotBuffers:
    C: object              # M x N in C's dtype: every owner writes its tiles' sums here
    partials: object       # one BLOCK_M x BLOCK_N slot per tile, in the wire dtype: this rank's partials
    partial_ready: object  # per tile (at its owner): partials counted in, W per launch
    results_in: object     # per owner, a cache line each: that owner's tiles written into our C
    taken: object          # per tile (at its owner): launches in which a program has taken it to reduce
    slices: object = None     # split-K and the few-rows kernel only (world size 1): a fp32 slot per K share
    slices_in: object = None  # the same: per cut tile (split-K: the last wave's), the shares counted in so far


def gemv_rows(config):
    """The few-rows kernel's rows a block (and a slot): one row (M = 1) by multiply-add, no tensor core; more, BLK_M by
    a 16-row-or-more dot."""
    return 1 if config.m == 1 else config.BLK_M


def buffers(alloc, config, world_size):
    tiles = config.tile_count
    # (a slot per cut tile and program sharing its K: cut + sharing in all; the few-rows kernel: a slot per program,
    # of one row at M = 1, and a count per column tile, at any number of slices)
    if config.gemv:
        split = dict(slices=alloc((config.num_sms, gemv_rows(config) * config.BLK_N), torch.float32),
                     slices_in=alloc(tiles, torch.int32))
    elif config.split_k > 1:
        split = dict(slices=alloc((config.cut_tiles + config.k_sharing, config.BLK_M * config.BLK_N), torch.float32),
                     slices_in=alloc(config.cut_tiles, torch.int32))
    else:
        split = {}
    return TwoShotBuffers(C=alloc((config.m, config.n), config.c_dtype),
                          partials=alloc((tiles, config.BLK_M * config.BLK_N), config.wire_torch_dtype),
                          partial_ready=alloc(tiles, torch.int32),
                          results_in=alloc(world_size * FLAG_WORDS, torch.int32), taken=alloc(tiles, torch.int32),
                          **split)


def launches(ctx, gemm_kernel=two_shot_gemm, reduce_kernel=two_shot_reduce):
    """Two kernels on two streams: the GEMM on the rank's, the reduction on its side stream (the rank's
    next launch waits for it). The reduction records into the trace buffer after the GEMM programs'.
    one_shot's launches are these, with its own two kernels (``gemm_kernel``, ``reduce_kernel``)."""
    cfg, buf = ctx.config, ctx.buffers
    # At world size 1 the GEMM programs write each tile into C themselves (one_rank_gemm), and the launch is
    # their kernel alone; with the package's own sum only: a participant's sum_partials (notebook 6) or a
    # teaching mistake must see every tile, so then the communication programs sum them all.
    if (cfg.split_k > 1 or cfg.gemv) and not SPEC.runs_its_own_parts(ctx.parts):   # (world size 1 only: RunConfig)
        knob = f"split_k={cfg.split_k}" if cfg.split_k > 1 else "gemv=True"
        raise UsageError(f"{knob} runs the package's own sum and wait only: a part of your own or a teaching mistake "
                         f"needs split_k=1 and gemv=False")
    if cfg.gemv:
        rows = gemv_rows(cfg)
        return [Launch(one_rank_gemv, (cfg.num_sms,), ctx.tuning(
            A=ctx.A, B=ctx.B, C=buf.C, partials=buf.partials, slices=buf.slices, slices_in=buf.slices_in, M=cfg.m,
            N=cfg.n, K=ctx.K, **ctx.strides, stride_cm=cfg.n, stride_cn=1, split_k=cfg.split_k, trace=ctx.trace,
            trace_counts=ctx.trace_counts, BLOCK_M=rows, BLOCK_N=cfg.BLK_N, BLOCK_K=cfg.BLK_K,
            DOT_PRECISION=ctx.gemm["DOT_PRECISION"], TRACE_CAPACITY=ctx.gemm["TRACE_CAPACITY"],
            EVEN_K=ctx.gemm["EVEN_K"], BY_DOT=rows > 1), waits=False)]
    if cfg.split_k > 1:
        return [Launch(one_rank_split_gemm, (cfg.num_sms,), ctx.tuning(
            A=ctx.A, B=ctx.B, C=buf.C, partials=buf.partials, slices=buf.slices, slices_in=buf.slices_in, M=cfg.m,
            N=cfg.n, K=ctx.K, **ctx.strides, stride_cm=cfg.n, stride_cn=1, trace=ctx.trace,
            trace_counts=ctx.trace_counts, **ctx.gemm, WHOLE_TILES=cfg.whole_tiles, SPLIT_K=cfg.split_k,
            SUM_ROWS=min(cfg.BLK_M, SPLIT_SUM_ROWS)))]
    if ctx.world_size == 1 and SPEC.runs_its_own_parts(ctx.parts):
        return [Launch(one_rank_gemm, (cfg.num_sms,), ctx.tuning(
            A=ctx.A, B=ctx.B, C=buf.C, partials=buf.partials, M=cfg.m, N=cfg.n, K=ctx.K, **ctx.strides,
            stride_cm=cfg.n, stride_cn=1, trace=ctx.trace, trace_counts=ctx.trace_counts, **ctx.gemm))]
    # GEMM programs help only when the communication programs are fewer than theirs (then each one is
    # an SM the GEMM does not have, and there may be too few to keep up); with one beside each GEMM program
    # there are enough, and looking over the tiles would only cost the GEMM programs time.
    help = cfg.comm_sms < cfg.num_sms
    # Beside the GEMM's, the communication programs must be small: they sum a tile in row chunks, at
    # COMM_WARPS. Few of them, on SMs of their own, must be quick per tile: the whole tile at once, at the
    # GEMM's warps (chunks at 4 warps took 11.7 us a tile instead of 3.1 there, and W = 2's tail grew from
    # 1.3 % to 7 %). The interpreter sums in chunks of 8 rows, so the CPU suite runs the chunked code.
    comm_warps = cfg.num_warps if help else COMM_WARPS
    reduce_rows = (cfg.BLK_M if help else REDUCE_ROWS) if ctx.gpu else 8
    if cfg.BLK_M % reduce_rows:
        reduce_rows = cfg.BLK_M
    gemm = Launch(gemm_kernel, (cfg.num_sms,), ctx.tuning(
        A=ctx.A, B=ctx.B, C=buf.C, partials=buf.partials, partial_ready=buf.partial_ready,
        results_in=buf.results_in, taken=buf.taken, heap_bases=ctx.heap.heap_bases, rank=ctx.rank,
        world_size=ctx.world_size, epoch=0, M=cfg.m, N=cfg.n, K=ctx.K, **ctx.strides, stride_cm=cfg.n, stride_cn=1,
        trace=ctx.trace, trace_counts=ctx.trace_counts, **ctx.gemm, HELP=help,
        SUM_PARTIALS=ctx.parts["sum_partials"], PEER_CACHE=ctx.peer_cache, REDUCE_ROWS=reduce_rows),
        per_launch=("epoch",))
    trace, trace_counts = ctx.trace_region(cfg.num_sms, cfg.comm_sms)
    reduce = Launch(reduce_kernel, (cfg.comm_sms,), ctx.tuning(
        C=buf.C, partials=buf.partials, partial_ready=buf.partial_ready, results_in=buf.results_in,
        taken=buf.taken, watchdog=ctx.watchdog, heap_bases=ctx.heap.heap_bases, rank=ctx.rank,
        world_size=ctx.world_size, epoch=0, M=cfg.m, N=cfg.n, stride_cm=cfg.n, stride_cn=1, timeout_ns=ctx.timeout_ns,
        trace=trace, trace_counts=trace_counts, BLOCK_M=cfg.BLK_M, BLOCK_N=cfg.BLK_N, GROUP_SIZE_M=cfg.gsize_m,
        COMM_SMS=cfg.comm_sms, TRACE_CAPACITY=ctx.gemm["TRACE_CAPACITY"], WAIT_FOR_PARTIALS=ctx.parts["partial_wait"],
        SUM_PARTIALS=ctx.parts["sum_partials"], PEER_CACHE=ctx.peer_cache, CLAIM=help, REDUCE_ROWS=reduce_rows,
        num_stages=1, num_warps=comm_warps),
        stream="side", per_launch=("epoch",))
    return [gemm, reduce]


def events_per_program(config, world_size, summed=None):
    """``summed``: how many tiles each rank sums (by default those it owns; one_shot's: every tile)."""
    # gemm and publish per tile (with take, reduce and broadcast at world size 1); take, reduce and broadcast
    # per summed tile it helps with
    summed = summed or [owned_count_on_host(config.tile_count, r, world_size) for r in range(world_size)]
    # (split-K at world size 1: gemm and publish per part of a share, take, reduce and broadcast for a tile's last
    # one: the program with the most whole tiles and parts, at most 5 events each)
    gemm = config.most_units_a_program * (5 if world_size == 1 else 2) + max(
        3 * -(-count // config.num_sms) for count in summed)
    return max([gemm] + [reduce_events(count, world_size, config.comm_sms) for count in summed])


def events_per_launch(config, world_size, rank, summed=None):
    """``summed``: how many tiles ``rank`` sums (by default those it owns; one_shot's: every tile)."""
    # gemm and publish per tile; the reduction's events as if one program recorded them all
    summed = owned_count_on_host(config.tile_count, rank, world_size) if summed is None else summed
    return config.work_units * 2 + reduce_events(summed, world_size, programs=1)


SPEC = AlgorithmSpec(
    name="two_shot", summary="GEMM programs publish each partial tile and never wait; communication programs "
                             "sum the tiles their rank owns and write the sum into every rank's C",
    buffers=buffers, launches=launches, output=lambda buffers, epoch: buffers.C, phases=PHASES,
    labels={"store": "storing a partial, counting it in"}, done=Done("broadcast", where="every_rank"),
    c_dtype=lambda config: config.torch_dtype, events_per_program=events_per_program,
    events_per_launch=events_per_launch,
    parts={"sum_partials": Part(sum_partials, "the tile's fp32 sum"), "partial_wait": WAIT_PART},
    mistake_parts={"skip_partial_wait": {"partial_wait": skip_the_wait}},
    comm_programs=True, comm_beside_gemm=True, wire_dtype=True, wait_flags=WAIT_FLAGS,
    # The TMA GEMM core's measured tile; for few rows at world size 1 (fewer tiles than SMs; the GEMM then reads
    # through plain pointers), by the most rows each suits, the fastest measured (docs/decisions.md, two_shot's
    # tiles). (The last bound is tuning.FEW_ROWS.)
    gpu_tuning={"hopper": (128, 256, 64, 8, 3, 8),
                "hopper_few_rows": {16: (16, 64, 128, 4, 4, 8), 64: (64, 64, 128, 4, 4, 8),
                                    512: (128, 128, 64, 4, 4, 8)}},
    builtin=True)
