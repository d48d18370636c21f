"""The standalone all-reduce's kernels: ``out = sum over ranks of x``, one launch per all-reduce, ``x``
read in place (laid out as one column of tiles, see ``runtime/allreduce.py``).

Two schemes, both summing in rank order in fp32 (so every rank gets the same bits):

- **two-shot** (``two_shot_all_reduce``: copy in and publish to owners, then two_shot's own reduction,
  ``reduce_tiles`` with the owner's plan): tile ``t`` is summed once, by its owner ``t % W``, which writes the
  sum into every rank. Each value crosses the links ``2 (W - 1) / W`` times: the scheme for large buffers.
- **one-shot** (``one_shot_all_reduce``: copy in and publish to every rank, then every rank reads every
  peer's copy of every tile and sums it itself). Each value crosses the links ``W - 1`` times, but there is
  one exchange instead of two: the scheme for small buffers, where latency, not bytes, decides.

One launch, not a copy and two kernels: for small buffers host time, not GPU work, decides. Large buffers
(``COPY_IN`` False) are copied in by torch first, on every SM, rather than by the few communication programs,
which were slower at it (docs/decisions.md, the all-reduce's copy-in). The launch number each program's flags count to (its ``epoch``) is read from the device, from the
program's own slot of ``launch_counts``, which the program moves on by one as its last act: a launch's
arguments are then the same every time, so the host can capture it once in a CUDA graph and replay it
(host time, not bytes, decides at 1-4 MiB). Program ``c`` of every rank has run the same number of launches
(every launch runs all ``COMM_SMS`` programs), so the slots agree across ranks. One-shot's launches are
back-to-back safe because a rank's launch ends
only after every rank has read its partials (step 3): its next copy into ``partials`` can then overwrite
nothing still needed; two-shot's because its last program waits until every owner has written its tiles
into this rank's ``out``, which each owner does only after reading every rank's partials.
"""

import triton
import triton.language as tl

from . import device
from .gemm import tile_rows_offsets
from .puzzle_parts import sum_partials   # (a puzzle's answer: see puzzle_parts.py)
from .owner_reduce import PARTIAL_READY_FLAG, owned_tiles, reduce_tiles, slot_rows
from .owner_reduce import WAIT_FLAGS as OWNER_WAIT_FLAGS

WAIT_FLAGS = {**OWNER_WAIT_FLAGS, "partials_read": 3}   # the ids its waits pass to wait_at_least
PARTIALS_READ_FLAG = tl.constexpr(WAIT_FLAGS["partials_read"])


@triton.jit
def copy_in_and_publish(x, numel, partials, partial_ready, heap_bases, rank, world_size, tile_id,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TO_EVERY_RANK: tl.constexpr,
                        COPY_IN: tl.constexpr, CHUNK: tl.constexpr):
    """This rank's values of tile ``tile_id`` (``x[tile * BLOCK_M * BLOCK_N:]``, zeros past ``numel``) into
    the tile's slot of ``partials`` (the same range of it; ``COPY_IN`` False: already there), then the tile
    counted in, with release, at its owner (two-shot) or at every rank (one-shot)."""
    if COPY_IN:
        for first in range(0, BLOCK_M * BLOCK_N, CHUNK):   # (a tile of more than CHUNK values would spill)
            offsets = tl.cast(tile_id, tl.int64) * (BLOCK_M * BLOCK_N) + first + tl.arange(0, CHUNK)
            tl.store(partials + offsets, tl.load(x + offsets, mask=offsets < numel, other=0))
    tl.debug_barrier()   # every thread's stores are in before the one thread that releases them
    if TO_EVERY_RANK:
        for step in range(world_size):
            device.atomic_add(partial_ready + tile_id, 1, rank, (rank + step) % world_size, heap_bases,
                              sem="release", scope="sys")
    else:
        device.atomic_add(partial_ready + tile_id, 1, rank, tile_id % world_size, heap_bases, sem="release",
                          scope="sys")


@triton.jit(do_not_specialize=["numel", "rank", "timeout_ns"])
def two_shot_all_reduce(
        # the values to sum and how many; the output, the partials and the flags, on the symmetric heap
        x, numel, out, partials, partial_ready, results_in, watchdog, heap_bases,
        # who; each program's launch count; the tiles' rows and columns; how long a wait may take; no trace
        rank, world_size, launch_counts, M, N, timeout_ns, no_trace,
        # the tiles and the programs, and how a tile is copied in and summed
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMM_SMS: tl.constexpr, PEER_CACHE: tl.constexpr,
        COPY_IN: tl.constexpr, ROWS: tl.constexpr):
    """Two-shot, one launch: program ``c`` first copies in and publishes, for every owner, the tiles that
    program ``c`` of each rank reduces (owned index ``tile // W``, taken ``c, c + COMM_SMS, ...``), then runs
    two_shot's reduction (steps 4-7) for them. Its waits depend only on what program ``c`` of every rank
    did before waiting, so under the interpreter (programs one after another) no rank waits in a circle."""
    c = tl.program_id(0)
    epoch = tl.load(launch_counts + c)
    total_tiles = tl.cdiv(M, BLOCK_M)
    for j in range(c, tl.cdiv(total_tiles, world_size), COMM_SMS):
        for owner in range(world_size):
            tile_id = owner + j * world_size
            if tile_id < total_tiles:
                copy_in_and_publish(x, numel, partials, partial_ready, heap_bases, rank, world_size, tile_id,
                                    BLOCK_M, BLOCK_N, False, COPY_IN, ROWS * BLOCK_N)
    reduce_tiles(out, partials, partial_ready, results_in, partial_ready, watchdog, heap_bases, rank, world_size,
                 epoch, M, N, N, 1, timeout_ns, no_trace, c, BLOCK_M, BLOCK_N, 1, COMM_SMS, 0, device.wait_for_tile,
                 PEER_CACHE, sum_partials, False, ROWS, owned_tiles)   # no CLAIM: nothing is taken, so any pointer does for taken
    tl.store(launch_counts + c, epoch + 1)


@triton.jit(do_not_specialize=["numel", "rank", "timeout_ns"])
def one_shot_all_reduce(
        # the values to sum and how many; the output, the partials and the flags, on the symmetric heap
        x, numel, out, partials, partial_ready, partials_read, watchdog, heap_bases,
        # who; each program's launch count; the tiles' rows and columns; how long a wait may take
        rank, world_size, launch_counts, M, N, timeout_ns,
        # the tiles and the programs, and how a tile is copied in and summed
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMM_SMS: tl.constexpr, PEER_CACHE: tl.constexpr,
        COPY_IN: tl.constexpr, ROWS: tl.constexpr):
    """Every tile, on every rank, one launch: 0. copy in and publish the tiles this program sums (to every
    rank); 1. wait until all W copies are published; 2. sum them in rank order into this rank's ``out``;
    tell each peer its copy was read. 3. Each program then waits until every rank has read this rank's
    copies of its own tiles, so that the launch ends only when ``partials`` may be overwritten. (Shared out
    over the programs: one program waiting for every tile, one flag after another, made one-shot several times
    slower than two-shot at large sizes; docs/decisions.md, one-shot's waits. Program ``c`` of every rank publishes the tiles program ``c``
    sums before any wait, so under the interpreter the ranks never wait on each other in a circle.)"""
    c = tl.program_id(0)
    epoch = tl.load(launch_counts + c)
    total_tiles = tl.cdiv(M, BLOCK_M)
    for tile_id in range(c, total_tiles, COMM_SMS):
        copy_in_and_publish(x, numel, partials, partial_ready, heap_bases, rank, world_size, tile_id, BLOCK_M,
                            BLOCK_N, True, COPY_IN, ROWS * BLOCK_N)
    for tile_id in range(c, total_tiles, COMM_SMS):
        device.wait_at_least(partial_ready + tile_id, world_size * (epoch + 1), timeout_ns, watchdog, rank, tile_id,
                             PARTIAL_READY_FLAG, tile_id)
        tl.debug_barrier()   # every thread reads the copies only after the acquire above
        for first in range(0, BLOCK_M, ROWS):
            total = sum_partials(slot_rows(partials, tile_id, first, ROWS, BLOCK_M, BLOCK_N), rank, world_size,
                                 heap_bases, PEER_CACHE)
            offsets, mask = tile_rows_offsets(tile_id, 0, first, M, N, N, 1, ROWS, BLOCK_M, BLOCK_N)
            tl.store(out + offsets, total.to(out.dtype.element_ty), mask=mask)
        tl.debug_barrier()   # every thread has read before anyone says so
        for step in range(world_size):
            device.atomic_add(partials_read + tile_id, 1, rank, (rank + step) % world_size, heap_bases,
                              sem="release", scope="sys")
    for tile_id in range(c, total_tiles, COMM_SMS):
        device.wait_at_least(partials_read + tile_id, world_size * (epoch + 1), timeout_ns, watchdog, rank, tile_id,
                             PARTIALS_READ_FLAG, tile_id)
    tl.store(launch_counts + c, epoch + 1)
