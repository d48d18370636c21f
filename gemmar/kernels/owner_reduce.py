"""The owner's reduction of two_shot (steps 4-7 of :mod:`gemmar.kernels.two_shot`'s docstring): the
communication programs' kernel, the sum of a tile's partials, its broadcast into every rank's C, the counts
that tell each peer its C is complete, and the GEMM programs' help with tiles already complete. The
standalone all-reduce (:mod:`gemmar.kernels.allreduce`) runs the same reduction over partials it copies
in itself.

Which tiles a rank sums, and into how many ranks' C it writes each sum, is the *plan*, a @triton.jit function
passed to the reduction's loops (``PLAN``): :func:`owned_tiles` here (the tiles the rank owns, each sum into
every rank's C); one_shot's ``every_tile`` (:mod:`gemmar.kernels.one_shot`: every tile, each sum into the
rank's own C only). The loops are the same steps either way, so they are written once; the plan is the idea
that tells the two algorithms apart."""

import triton
import triton.language as tl

from . import device
from .device import FLAG_STRIDE
from .events import event, finish_trace, stamp
from .gemm import tile_coords, tile_offsets, tile_rows_offsets
from .spec import Phase

# The reduction's trace events (two_shot's phases after its gemm and publish).
REDUCTION_PHASES = (
    Phase(10, "partial_wait", "wait", "tile {tile} waits for partial_ready (all {world_size} ranks' partials "
                                      "of the tile it owns)"),
    Phase(6, "reduce", "reduce"),
    Phase(11, "broadcast", "comm"),      # the owner writes the sum into every rank's C
    Phase(12, "result_wait", "wait", "waits for results_in (every tile rank {peer} owns, written into this "
                                     "rank's C)", whole_launch=True),
    Phase(13, "take", "comm"))          # a GEMM program finds all partials of a tile in, and takes it
PARTIAL_WAIT, REDUCE, BROADCAST, RESULT_WAIT, TAKE = (tl.constexpr(p.kind_id) for p in REDUCTION_PHASES)
WAIT_FLAGS = {"partial_ready": 1, "results_in": 2}   # the ids its waits pass to wait_at_least
PARTIAL_READY_FLAG, RESULTS_IN_FLAG = tl.constexpr(WAIT_FLAGS["partial_ready"]), tl.constexpr(WAIT_FLAGS["results_in"])

# A communication program sums a tile REDUCE_ROWS rows at a time, with COMM_WARPS warps: few enough registers
# to share an SM with a GEMM program of the 128 x 256 tile, so that the GEMM keeps every SM (docs/decisions.md,
# REDUCE_ROWS and COMM_WARPS).
REDUCE_ROWS, COMM_WARPS = 32, 4


@triton.jit
def slot_pointers(partials, tile_id, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where tile ``tile_id``'s partial lives: a dense BLOCK_M x BLOCK_N slot (edge tiles carry padding that
    is never stored in C). Built from the tile id each time, like C's offsets: a 2-D offset tensor made once
    outside the tile loop would stay live in registers beside the accumulator and push the GEMM into
    spilling (measured several times slower: docs/decisions.md, slot pointers)."""
    return slot_rows(partials, tile_id, 0, BLOCK_M, BLOCK_M, BLOCK_N)


@triton.jit
def slot_rows(partials, tile_id, first, ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows ``first`` .. ``first + ROWS - 1`` of tile ``tile_id``'s slot."""
    rows = tl.cast(tile_id, tl.int64) * BLOCK_M + first + tl.arange(0, ROWS)
    return partials + rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]


@triton.jit(do_not_specialize=["rank", "epoch", "timeout_ns"])
def two_shot_reduce(
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
    """The communication programs: reduce the tiles this rank owns that no GEMM program took (``CLAIM``: GEMM
    programs may take tiles), then wait for the others (steps 4-7). ``trace`` and ``trace_counts`` start at
    this kernel's own region of the rank's trace buffer. ``results_in`` holds one counter per owner,
    ``FLAG_STRIDE`` int32s apart (a cache line each)."""
    n_events = reduce_tiles(
        C, partials, partial_ready, results_in, taken, watchdog, heap_bases, rank, world_size, epoch, M, N,
        stride_cm, stride_cn, timeout_ns, trace, tl.program_id(0), BLOCK_M, BLOCK_N, GROUP_SIZE_M, COMM_SMS,
        TRACE_CAPACITY, WAIT_FOR_PARTIALS, PEER_CACHE, SUM_PARTIALS, CLAIM, REDUCE_ROWS, owned_tiles)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


@triton.jit
def owned_count(total_tiles, owner, world_size):
    """How many of ``total_tiles`` tiles rank ``owner`` owns (tile t belongs to rank t % world_size)."""
    return tl.maximum(total_tiles - owner + world_size - 1, 0) // world_size


@triton.jit
def owned_tiles(total_tiles, rank, world_size):
    """two_shot's plan: rank ``rank`` sums the tiles it owns, ``rank, rank + W, ...`` (``first``, ``stride``,
    ``count``), and writes each sum into ``copies`` = every rank's C."""
    return rank, world_size, owned_count(total_tiles, rank, world_size), world_size


@triton.jit
def reduce_and_broadcast(
        # where: our C and partials (the heap), the tile, and C's shape
        C, partials, heap_bases, rank, world_size, M, N, stride_cm, stride_cn, tile_id, num_pid_m, num_pid_n,
        # into how many ranks' C the sum goes (the plan's copies)
        copies,
        # the trace: its buffer, events so far, the wait's start and its kind (FIRST)
        trace, n_events, t, FIRST: tl.constexpr,
        # the tiles, and how the sum runs
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr, TRACE_CAPACITY: tl.constexpr,
        PEER_CACHE: tl.constexpr, SUM_PARTIALS: tl.constexpr, REDUCE_ROWS: tl.constexpr):
    """Steps 5 and 6 for one tile whose partials are all in (acquired by this program since ``t``, by a wait
    or a look, recorded as a ``FIRST`` event): their sum, in rank order and fp32, written in C's dtype into
    ``copies`` ranks' C: ours first, then the next ones (two_shot's owner: every rank's; one_shot: ours only,
    every rank sums the tile itself). Returns ``n_events`` after its three events.

    ``REDUCE_ROWS`` < ``BLOCK_M`` sums the tile ``REDUCE_ROWS`` rows at a time into our C, then copies it
    from there to the peers: a whole 128 x 256 fp32 sum needs 128 registers a thread at 8 warps, a
    32-row one 64 at 4 warps, small enough for a communication program to share an SM with a GEMM
    program (the GEMM then keeps every SM). The ``reduce`` event then covers the writes into our C too."""
    tl.debug_barrier()  # every thread reads the partials only after the acquire
    pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
    n_events, t = event(trace, n_events, t, FIRST, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    if REDUCE_ROWS == BLOCK_M:
        total = SUM_PARTIALS(slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N), rank, world_size, heap_bases,
                             PEER_CACHE)
        n_events, t = event(trace, n_events, t, REDUCE, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        result = total.to(C.dtype.element_ty)
        for step in range(copies):
            device.store(C + offsets, result, rank, (rank + step) % world_size, heap_bases, mask=mask)
    else:
        for r0 in range(0, BLOCK_M, REDUCE_ROWS):
            total = SUM_PARTIALS(slot_rows(partials, tile_id, r0, REDUCE_ROWS, BLOCK_M, BLOCK_N), rank, world_size,
                                 heap_bases, PEER_CACHE)
            offsets, mask = tile_rows_offsets(pid_m, pid_n, r0, M, N, stride_cm, stride_cn, REDUCE_ROWS,
                                              BLOCK_M, BLOCK_N)
            tl.store(C + offsets, total.to(C.dtype.element_ty), mask=mask)
        n_events, t = event(trace, n_events, t, REDUCE, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        # Our C's rows are read back by whichever thread the load's layout gives them to: the block barrier
        # makes every thread's writes visible to all of them first.
        tl.debug_barrier()
        for step in range(1, copies):
            for r0 in range(0, BLOCK_M, REDUCE_ROWS):
                offsets, mask = tile_rows_offsets(pid_m, pid_n, r0, M, N, stride_cm, stride_cn, REDUCE_ROWS,
                                                  BLOCK_M, BLOCK_N)
                device.store(C + offsets, tl.load(C + offsets, mask=mask), rank, (rank + step) % world_size,
                             heap_bases, mask=mask)
    n_events, t = event(trace, n_events, t, BROADCAST, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    return n_events


@triton.jit
def count_in_at_peers(results_in, broadcast, rank, world_size, heap_bases):
    """The end of step 6 for one program: the ``broadcast`` tiles it wrote counted in at each peer (one-shot:
    the tiles whose partials it has read from every peer), once, after its last one. (A release per tile and
    peer waited each time for the tile's stores to land, longer than the stores took (docs/decisions.md, one
    count per program). Nobody needs the count sooner: only step 7 reads it.)"""
    if broadcast > 0:
        tl.debug_barrier()   # every thread's stores are in before the one thread that releases them
        for step in range(1, world_size):
            device.atomic_add(results_in + rank * FLAG_STRIDE, broadcast, rank, (rank + step) % world_size,
                              heap_bases, sem="release", scope="sys")


@triton.jit
def take_tile(taken, tile_id, epoch, CLAIM: tl.constexpr):
    """Whether this program reduces tile ``tile_id`` in launch ``epoch``: the first program to move
    ``taken[tile_id]`` from ``epoch`` to ``epoch + 1`` does. Once per launch per tile, so the counter is
    ``epoch`` when a launch starts and needs no reset. Without ``CLAIM`` (nobody else reduces this rank's
    tiles) every tile is the program's own. (At world size 1 the GEMM program takes a tile with an exchange,
    not this: nobody else can take it before it counts itself in.)"""
    if CLAIM:
        mine = tl.atomic_cas(taken + tile_id, epoch, epoch + 1, sem="relaxed", scope="gpu") == epoch
    else:
        mine = tl.full((), 1, tl.int1)
    return mine


@triton.jit
def reduce_tiles(
        # the output, the partials and the flags, on the symmetric heap
        C, partials, partial_ready, results_in, taken, watchdog, heap_bases,
        # who and which launch
        rank, world_size, epoch,
        # C's shape and strides; how long a wait may take
        M, N, stride_cm, stride_cn, timeout_ns,
        # the trace buffer; which communication program this is
        trace, c,
        # the tiles and the programs
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr, COMM_SMS: tl.constexpr,
        TRACE_CAPACITY: tl.constexpr,
        # parts (step 4's wait, step 5's sum), how the sum runs, and which tiles this rank sums (PLAN)
        WAIT_FOR_PARTIALS: tl.constexpr, PEER_CACHE: tl.constexpr, SUM_PARTIALS: tl.constexpr, CLAIM: tl.constexpr,
        REDUCE_ROWS: tl.constexpr, PLAN: tl.constexpr):
    """Steps 4-7 for communication program ``c``: of the tiles this rank sums (``PLAN``: :func:`owned_tiles`,
    or one_shot's every tile), the ``c``-th, ``c + COMM_SMS``-th, ..., less those a GEMM program has taken
    (``CLAIM``); returns the number of events it recorded. Also the standalone all-reduce's reduction (no
    ``CLAIM``). ``WAIT_FOR_PARTIALS`` is step 4's wait, a part (``device.wait_for_tile``, or a mistake's
    function in its place)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total_tiles = num_pid_m * num_pid_n
    n_events = tl.zeros((), tl.int32)
    first, stride, count, copies = PLAN(total_tiles, rank, world_size)
    summed = tl.zeros((), tl.int32)   # tiles this program has summed (and written into `copies` ranks' C)
    for j in range(c, count, COMM_SMS):
        tile_id = first + j * stride
        # 4. Every rank's partial of launch `epoch` is in. Then the tile is ours unless a GEMM program has
        # taken it (it takes only complete tiles, so waiting first costs nothing; taking first would take
        # tiles from under their owner's GEMM program, which sums its own tiles before counting itself in).
        t = stamp(TRACE_CAPACITY)
        WAIT_FOR_PARTIALS(partial_ready + tile_id, world_size * (epoch + 1), timeout_ns, watchdog, rank, tile_id,
                          PARTIAL_READY_FLAG)
        if take_tile(taken, tile_id, epoch, CLAIM):
            # 5 and 6.
            n_events = reduce_and_broadcast(C, partials, heap_bases, rank, world_size, M, N, stride_cm, stride_cn,
                                            tile_id, num_pid_m, num_pid_n, copies, trace, n_events, t, PARTIAL_WAIT,
                                            BLOCK_M, BLOCK_N, GROUP_SIZE_M, TRACE_CAPACITY, PEER_CACHE, SUM_PARTIALS,
                                            REDUCE_ROWS)
            summed += 1
    count_in_at_peers(results_in, summed, rank, world_size, heap_bases)
    # 7. Every other rank's tiles: the last communication program waits for each peer's count, after its own
    # reductions (two_shot: until each owner's tiles are in our C; one_shot: until each peer has read all of
    # this rank's partials). (Under the interpreter every reduction of this rank has then run before any of
    # its waits, which is what keeps the ranks from waiting on each other in a circle there.)
    last = c == COMM_SMS - 1
    t = stamp(TRACE_CAPACITY)
    for step in range(1, tl.where(last, world_size, 1)):
        owner = (rank + step) % world_size
        owner_first, owner_stride, owner_count, owner_copies = PLAN(total_tiles, owner, world_size)
        device.wait_at_least(results_in + owner * FLAG_STRIDE, owner_count * (epoch + 1), timeout_ns, watchdog,
                             rank, -1, RESULTS_IN_FLAG, owner)
        n_events, t = event(trace, n_events, t, RESULT_WAIT, -1, -1, -1, 0, owner, TRACE_CAPACITY)
    return n_events


@triton.jit
def help_reduce(
        # the output, the partials and the flags, on the symmetric heap
        C, partials, partial_ready, taken, heap_bases,
        # who and which launch; C's shape and strides
        rank, world_size, epoch, M, N, stride_cm, stride_cn,
        # the trace: its buffer and events so far; which GEMM program this is
        trace, n_events, pid,
        # the tiles and the programs
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr, NUM_SMS: tl.constexpr,
        TRACE_CAPACITY: tl.constexpr,
        # step 5's sum and how it runs; which tiles this rank sums (PLAN)
        PEER_CACHE: tl.constexpr, SUM_PARTIALS: tl.constexpr, REDUCE_ROWS: tl.constexpr, PLAN: tl.constexpr):
    """A GEMM program that has published all its tiles helps with the reduction of the tiles this rank sums
    (``PLAN``) without ever waiting: it looks at them from the last one back (``count - 1 - pid``, then
    ``NUM_SMS`` further back, ...), and reduces each whose partials are all in already and that no program has
    taken yet (steps 5 and 6); one that is not ready it leaves to the communication programs. Returns
    ``n_events`` and how many tiles it summed.

    Why: the communication programs keep up with the GEMM only if there are enough of them, and each one
    is an SM the GEMM does not have (16 of 132 at K_r 2048 made the GEMM take 18 waves of tiles instead of
    16). With the GEMM programs draining what is left when their own tiles are done, fewer suffice."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    first, stride, count, copies = PLAN(num_pid_m * num_pid_n, rank, world_size)
    summed = tl.zeros((), tl.int32)
    for k in range(pid, count, NUM_SMS):
        tile_id = first + (count - 1 - k) * stride
        t = stamp(TRACE_CAPACITY)
        # An acquire look, not a wait: a tile not complete yet is a communication program's.
        seen = tl.atomic_add(partial_ready + tile_id, 0, sem="acquire", scope="sys")
        if seen >= world_size * (epoch + 1):
            if take_tile(taken, tile_id, epoch, True):
                n_events = reduce_and_broadcast(C, partials, heap_bases, rank, world_size, M, N, stride_cm,
                                                stride_cn, tile_id, num_pid_m, num_pid_n, copies, trace, n_events, t,
                                                TAKE, BLOCK_M, BLOCK_N, GROUP_SIZE_M, TRACE_CAPACITY, PEER_CACHE,
                                                SUM_PARTIALS, REDUCE_ROWS)
                summed += 1
    return n_events, summed


def owned_count_on_host(total_tiles, owner, world_size):
    """:func:`owned_count` on the host: how many tiles rank ``owner`` owns (tile t belongs to rank t % world_size)."""
    return max(0, -(-(total_tiles - owner) // world_size))


def reduce_events(owned, world_size, programs):
    """Events the communication programs record: partial_wait, reduce and broadcast per owned tile (shared
    out over ``programs`` of them), and a result_wait per other owner (by the last one)."""
    return 3 * -(-owned // programs) + world_size - 1
