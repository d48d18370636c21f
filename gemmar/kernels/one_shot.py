"""GEMM + all-reduce, one-shot: every rank sums every tile itself, from all ranks' partials.

two_shot (:mod:`gemmar.kernels.two_shot`, read it first) sends each partial to the tile's owner, which sums
it and hands the sum back: two exchanges, ``2 (W - 1) / W`` copies of each partial on the links. Here every
rank reads every peer's partial of every tile and sums it itself, into its own C only: one exchange instead
of two, for ``W - 1`` copies. The path for small C, where each exchange's latency, not its bytes, decides.

The same buffers, the same two kernels' shape and two_shot's launches; what changes is the idea, so it is
written out in this algorithm's own kernels rather than as a switch inside two_shot's (a learner reads one
algorithm per kernel, and no branch of another one's):

- **GEMM programs** (``one_shot_gemm``): 1. compute the partial tile; 2. store it into ``partials[tile]`` on
  this rank's own heap; 3. count it in at *every* rank (``partial_ready[tile]`` there), since every rank sums
  it. Then, as two_shot's, help with the sums that are ready, without waiting.
- **communication programs** (``one_shot_reduce``), for every tile: 4. wait until all W partials are in;
  5. sum them in rank order, in fp32 (every rank gets the same bits); 6. write the sum into this rank's own C;
  after its last tile each program counts, at every peer, the tiles whose partials it has read; 7. the last
  program waits until every peer has read all of this rank's partials (``results_in``), which is what makes the
  next launch's overwriting of ``partials`` safe.

Steps 4-7 are two_shot's reduction (:func:`owner_reduce.reduce_tiles`) with another *plan*,
:func:`every_tile`: which tiles a rank sums (every one) and into how many ranks' C each sum goes (its own).
At world size 1 the launch is two_shot's ``one_rank_gemm``, as there.
"""

import dataclasses
import functools

import triton
import triton.language as tl

from . import device
from .events import event, finish_trace
from .gemm import tile_coords, traced_gemm_tile
from .owner_reduce import WAIT_FLAGS, count_in_at_peers, help_reduce, reduce_tiles, slot_pointers
from .spec import AlgorithmSpec, Done
from .two_shot import PHASES, PUBLISH, SPEC as TWO_SHOT_SPEC, buffers, events_per_launch, events_per_program, \
    launches


@triton.jit
def every_tile(total_tiles, rank, world_size):
    """one_shot's plan: every rank sums every tile, ``0, 1, ...`` (``first``, ``stride``, ``count``), and writes
    each sum into ``copies`` = 1 rank's C: its own."""
    return 0, 1, total_tiles, 1


@triton.jit(do_not_specialize=["rank", "epoch"])
def one_shot_gemm(
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
        # the sums the GEMM programs help with: whether they do, step 5's sum (a part), how it runs
        HELP: tl.constexpr, SUM_PARTIALS: tl.constexpr, PEER_CACHE: tl.constexpr, REDUCE_ROWS: tl.constexpr):
    """The GEMM programs: compute each tile, publish it to every rank, move on (steps 1-3); then help with
    this rank's sums of what is ready (two_shot's :func:`help_reduce`, every tile), still without waiting."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see gemm.traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in tl.range(pid, num_pid_m * num_pid_n, NUM_SMS):
        # 1. Our partial of the tile.
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, tile_coords, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M,
                                                           DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY)
        # 2. Our partial of this tile, into our own heap.
        tl.store(slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N), acc.to(partials.dtype.element_ty))
        # 3. Count it in at every rank (each sums it): release, after every thread's store.
        tl.debug_barrier()
        for step in range(world_size):
            device.atomic_add(partial_ready + tile_id, 1, rank, (rank + step) % world_size, heap_bases,
                              sem="release", scope="sys")
        n_events, t = event(trace, n_events, t, PUBLISH, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    summed = tl.zeros((), tl.int32)   # tiles this program has summed (their partials read from every peer)
    if HELP:
        n_events, summed = help_reduce(C, partials, partial_ready, taken, heap_bases, rank, world_size, epoch, M, N,
                                       stride_cm, stride_cn, trace, n_events, pid, BLOCK_M, BLOCK_N, GROUP_SIZE_M,
                                       NUM_SMS, TRACE_CAPACITY, PEER_CACHE, SUM_PARTIALS, REDUCE_ROWS, every_tile)
    count_in_at_peers(results_in, summed, rank, world_size, heap_bases)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit(do_not_specialize=["rank", "epoch", "timeout_ns"])
def one_shot_reduce(
        # the output, the partials and the flags, on the symmetric heap
        C, partials, partial_ready, results_in, taken, watchdog, heap_bases,
        # who and which launch
        rank, world_size, epoch,
        # C's shape and strides; how long a wait may take
        M, N, stride_cm, stride_cn, timeout_ns,
        # this kernel's region of the trace buffer
        trace, trace_counts,
        # the tiles and the programs
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr, COMM_SMS: tl.constexpr,
        TRACE_CAPACITY: tl.constexpr,
        # parts (step 4's wait, step 5's sum) and how the sum runs
        WAIT_FOR_PARTIALS: tl.constexpr, SUM_PARTIALS: tl.constexpr, PEER_CACHE: tl.constexpr,
        CLAIM: tl.constexpr, REDUCE_ROWS: tl.constexpr):
    """The communication programs: sum every tile that no GEMM program took (``CLAIM``: GEMM programs may take
    tiles) into this rank's C, then wait until every peer has read this rank's partials (steps 4-7)."""
    n_events = reduce_tiles(
        C, partials, partial_ready, results_in, taken, watchdog, heap_bases, rank, world_size, epoch, M, N,
        stride_cm, stride_cn, timeout_ns, trace, tl.program_id(0), BLOCK_M, BLOCK_N, GROUP_SIZE_M, COMM_SMS,
        TRACE_CAPACITY, WAIT_FOR_PARTIALS, PEER_CACHE, SUM_PARTIALS, CLAIM, REDUCE_ROWS, every_tile)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


# -- the spec --------------------------------------------------------------------------------------------
PHASES_HERE = tuple(
    dataclasses.replace(p, waits_for={
        "partial_wait": "tile {tile} waits for partial_ready (all {world_size} ranks' partials of the tile)",
        "result_wait": "waits for results_in (rank {peer} has read every partial of this rank's)",
    }.get(p.name, p.waits_for)) for p in PHASES)


def events_per_program_here(config, world_size):
    return events_per_program(config, world_size, summed=[config.tile_count] * world_size)


def events_per_launch_here(config, world_size, rank):
    return events_per_launch(config, world_size, rank, summed=config.tile_count)


SPEC = AlgorithmSpec(
    name="one_shot", summary="every rank sums every tile from all ranks' partials and writes only its own C: "
                             "one exchange instead of two_shot's two",
    buffers=buffers, launches=functools.partial(launches, gemm_kernel=one_shot_gemm, reduce_kernel=one_shot_reduce),
    output=TWO_SHOT_SPEC.output, phases=PHASES_HERE,
    labels={"store": "storing a partial, counting it in at every rank"}, done=Done("broadcast"),
    c_dtype=TWO_SHOT_SPEC.c_dtype,
    events_per_program=events_per_program_here, events_per_launch=events_per_launch_here,
    parts=TWO_SHOT_SPEC.parts, mistake_parts=TWO_SHOT_SPEC.mistake_parts, comm_programs=True,
    comm_beside_gemm=True, wire_dtype=True, wait_flags=WAIT_FLAGS, gpu_tuning=TWO_SHOT_SPEC.gpu_tuning, builtin=True)
