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
  6. write the sum, in C's dtype, into C on every rank. After its last tile, each communication program
     adds the number of tiles it wrote (one block barrier, then a release-add per peer) to
     ``results_in[rank]`` in each peer's heap: how many of this owner's tiles have reached that peer's C,
     counted over every launch;

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

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import device
from .device import FLAG_STRIDE, FLAG_WORDS, PARTIAL_READY_FLAG, RESULTS_IN_FLAG
from .events import event, finish_trace, stamp
from .gemm import GEMM_PHASE, tile_coords, tile_offsets, traced_gemm_tile
from .spec import AlgorithmSpec, Done, Launch, Part, Phase

PHASES = (GEMM_PHASE,
          Phase(9, "publish", "store"),        # a GEMM program stores its partial and tells the owner
          Phase(10, "partial_wait", "wait", "tile {tile} waits for partial_ready (all {world_size} ranks' partials "
                                            "of the tile it owns)"),
          Phase(6, "reduce", "reduce"),
          Phase(11, "broadcast", "comm"),      # the owner writes the sum into every rank's C
          Phase(12, "result_wait", "wait", "waits for results_in (every tile rank {peer} owns, written into this "
                                           "rank's C)", whole_launch=True))
PUBLISH, PARTIAL_WAIT, REDUCE, BROADCAST, RESULT_WAIT = (tl.constexpr(p.kind_id) for p in PHASES[1:])

MISTAKES = ("none", "skip_partial_wait")
SKIP_PARTIAL_WAIT = tl.constexpr(MISTAKES.index("skip_partial_wait"))


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
        # 1. Our partial of the tile.
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(
            A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_id, num_pid_m, num_pid_n, trace,
            n_events, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY,
            tile_coords)
        owner = tile_id % world_size
        # 2. Our partial of this tile, into our own heap.
        tl.store(slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N), acc.to(partials.dtype.element_ty))
        # 3. Count it in at the owner: release, after every thread's store.
        tl.debug_barrier()
        device.atomic_add(partial_ready + tile_id, 1, rank, owner, heap_bases, sem="release", scope="sys")
        n_events, t = event(trace, n_events, t, PUBLISH, tile_id, pid_m, pid_n, 0, owner, TRACE_CAPACITY)
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
    n_events = reduce_owned_tiles(
        C, partials, partial_ready, results_in, watchdog, heap_bases, rank, world_size, epoch, M, N, stride_cm,
        stride_cn, timeout_ns, trace, tl.program_id(0), BLOCK_M, BLOCK_N, GROUP_SIZE_M, COMM_SMS, TRACE_CAPACITY,
        MISTAKE, PEER_CACHE, SUM_PARTIALS)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit
def reduce_owned_tiles(
        C, partials, partial_ready, results_in, watchdog, heap_bases, rank, world_size, epoch, M, N,
        stride_cm, stride_cn, timeout_ns, trace, c,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr, COMM_SMS: tl.constexpr,
        TRACE_CAPACITY: tl.constexpr, MISTAKE: tl.constexpr, PEER_CACHE: tl.constexpr,
        SUM_PARTIALS: tl.constexpr):
    """Steps 4-7 for communication program ``c``: owned tiles ``c, c + COMM_SMS, ...`` (in the order this rank
    owns them); returns the number of events it recorded. Also the standalone all-reduce's reduction."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total_tiles = num_pid_m * num_pid_n
    n_events = tl.zeros((), tl.int32)
    owned = tl.maximum(total_tiles - rank + world_size - 1, 0) // world_size
    broadcast = tl.zeros((), tl.int32)   # tiles this program has written into every rank's C
    for j in range(c, owned, COMM_SMS):
        tile_id = rank + j * world_size
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        # 4. Every rank's partial of launch `epoch` is in.
        t = stamp(TRACE_CAPACITY)
        if MISTAKE != SKIP_PARTIAL_WAIT:
            device.wait_at_least(partial_ready + tile_id, world_size * (epoch + 1), timeout_ns, watchdog,
                                 rank, tile_id, PARTIAL_READY_FLAG, tile_id)
        tl.debug_barrier()  # every thread reads the partials only after the acquire above
        n_events, t = event(trace, n_events, t, PARTIAL_WAIT, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        # 5. Sum the partials in rank order, in fp32.
        total = SUM_PARTIALS(slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N), rank, world_size, heap_bases,
                             PEER_CACHE)
        n_events, t = event(trace, n_events, t, REDUCE, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        # 6. The sum, in C's dtype, into every rank's C (ours first).
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        result = total.to(C.dtype.element_ty)
        for step in range(world_size):
            device.store(C + offsets, result, rank, (rank + step) % world_size, heap_bases, mask=mask)
        n_events, t = event(trace, n_events, t, BROADCAST, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        broadcast += 1
    # ... and the tiles this program wrote counted in at each peer, once, after its last one. A release per
    # tile and peer waited each time for the tile's stores to land (3.4 us a tile at W = 2 on an H200, more
    # than the stores); nobody needs the count sooner, since only step 7 reads it.
    if broadcast > 0:
        tl.debug_barrier()   # every thread's stores are in before the one thread that releases them
        for step in range(1, world_size):
            device.atomic_add(results_in + rank * FLAG_STRIDE, broadcast, rank, (rank + step) % world_size,
                              heap_bases, sem="release", scope="sys")
    # 7. Every other owner's tiles: the last communication program waits for each owner's count, after its
    # own reductions. (Under the interpreter every reduction of this rank has then run before any of its
    # waits, which is what keeps the ranks from waiting on each other in a circle there.)
    last = c == COMM_SMS - 1
    t = stamp(TRACE_CAPACITY)
    for step in range(1, tl.where(last, world_size, 1)):
        owner = (rank + step) % world_size
        target = (tl.maximum(total_tiles - owner + world_size - 1, 0) // world_size) * (epoch + 1)
        device.wait_at_least(results_in + owner * FLAG_STRIDE, target, timeout_ns, watchdog, rank, -1,
                             RESULTS_IN_FLAG, owner)
        n_events, t = event(trace, n_events, t, RESULT_WAIT, -1, -1, -1, 0, owner, TRACE_CAPACITY)
    return n_events


# -- the spec --------------------------------------------------------------------------------------------
@dataclass
class TwoShotBuffers:
    C: object              # M x N in C's dtype: every owner writes its tiles' sums here
    partials: object       # one BLOCK_M x BLOCK_N slot per tile, in the wire dtype: this rank's partials
    partial_ready: object  # per tile (at its owner): partials counted in, W per launch
    results_in: object     # per owner, a cache line each: that owner's tiles written into our C


def buffers(alloc, config, world_size):
    tiles = config.tile_count
    return TwoShotBuffers(C=alloc((config.m, config.n), config.c_dtype),
                          partials=alloc((tiles, config.BLK_M * config.BLK_N), config.partial_dtype),
                          partial_ready=alloc(tiles, torch.int32),
                          results_in=alloc(world_size * FLAG_WORDS, torch.int32))


def launches(ctx):
    """Two kernels on two streams: the GEMM on the rank's, the reduction on its side stream (the rank's
    next launch waits for it). The reduction records into the trace buffer after the GEMM programs'."""
    cfg, buf = ctx.config, ctx.buffers
    gemm = Launch(two_shot_gemm, (cfg.num_sms,), ctx.tuning(
        A=ctx.A, B=ctx.B, partials=buf.partials, partial_ready=buf.partial_ready, heap_bases=ctx.heap.heap_bases,
        rank=ctx.rank, world_size=ctx.world_size, M=cfg.m, N=cfg.n, K=ctx.K, **ctx.strides, trace=ctx.trace,
        trace_counts=ctx.trace_counts, **ctx.gemm))
    trace, trace_counts = ctx.trace_region(cfg.num_sms, cfg.comm_sms)
    reduce = Launch(two_shot_reduce, (cfg.comm_sms,), ctx.tuning(
        C=buf.C, partials=buf.partials, partial_ready=buf.partial_ready, results_in=buf.results_in,
        watchdog=ctx.watchdog, heap_bases=ctx.heap.heap_bases, rank=ctx.rank, world_size=ctx.world_size, epoch=0,
        M=cfg.m, N=cfg.n, stride_cm=cfg.n, stride_cn=1, timeout_ns=ctx.timeout_ns, trace=trace,
        trace_counts=trace_counts, BLOCK_M=cfg.BLK_M, BLOCK_N=cfg.BLK_N, GROUP_SIZE_M=cfg.gsize_m,
        COMM_SMS=cfg.comm_sms, TRACE_CAPACITY=ctx.gemm["TRACE_CAPACITY"], MISTAKE=ctx.mistake,
        PEER_CACHE=ctx.peer_cache, SUM_PARTIALS=ctx.parts["sum_partials"], num_stages=1),
        stream="side", per_launch=("epoch",))
    return [gemm, reduce]


def owned_tiles(total_tiles, world_size, rank):
    """How many tiles rank owns (tile t belongs to rank t % world_size)."""
    return max(0, -(-(total_tiles - rank) // world_size))


def reduce_events(owned, world_size, programs):
    """Events the communication programs record: partial_wait, reduce and broadcast per owned tile (shared
    out over ``programs`` of them), and a result_wait per other owner (by the last one)."""
    return 3 * -(-owned // programs) + world_size - 1


def events_per_program(config, world_size):
    gemm = -(-config.tile_count // config.num_sms) * 2   # gemm, publish
    return max([gemm] + [reduce_events(owned_tiles(config.tile_count, world_size, r), world_size, config.comm_sms)
                         for r in range(world_size)])


SPEC = AlgorithmSpec(
    name="two_shot", summary="GEMM programs publish each partial tile and never wait; communication programs "
                             "sum the tiles their rank owns and write the sum into every rank's C",
    buffers=buffers, launches=launches, output=lambda buffers, epoch: buffers.C, phases=PHASES,
    labels={"store": "storing a partial, counting it in"}, done=Done("broadcast", where="every_rank"),
    c_dtype=lambda config: config.torch_dtype, events_per_program=events_per_program,
    events_per_launch=lambda cfg, W, rank: cfg.tile_count * 2 + reduce_events(
        owned_tiles(cfg.tile_count, W, rank), W, programs=1),
    parts={"sum_partials": Part(sum_partials, "the tile's fp32 sum")}, mistakes=MISTAKES,
    comm_programs=True, wire_dtype=True,
    gpu_tuning={"hopper": (128, 256, 64, 8, 3, 8)},   # the TMA GEMM core's tile on 1 x H200 (BENCHMARKS.md)
    builtin=True)
