"""The standalone all-reduce's kernels: ``out = sum over ranks of x``, for a buffer already copied into each
rank's ``partials`` (laid out as one column of tiles, see ``runtime/allreduce.py``).

Two schemes, both summing in rank order in fp32 (so every rank gets the same bits):

- **two-shot** (``publish_partials`` to owners, then two_shot's own ``two_shot_reduce``): tile ``t`` is
  summed once, by its owner ``t % W``, which writes the sum into every rank. Each value crosses the links
  ``2 (W - 1) / W`` times: the scheme for large buffers.
- **one-shot** (``publish_partials`` to every rank, then ``one_shot_reduce``): every rank reads every
  peer's copy of every tile and sums it itself. Each value crosses the links ``W - 1`` times, but there is
  one exchange instead of two: the scheme for small buffers, where latency, not bytes, decides.

One-shot's launches are back-to-back safe because a rank's launch ends only after every rank has read its
partials (step 3 below): its next copy into ``partials`` can then overwrite nothing still needed.
"""

import triton
import triton.language as tl

from . import device
from .device import PARTIAL_READY_FLAG, PARTIALS_READ_FLAG
from .gemm import tile_offsets
from .two_shot import slot_pointers


@triton.jit(do_not_specialize=["rank"])
def publish_partials(partial_ready, heap_bases, rank, world_size, total_tiles, COMM_SMS: tl.constexpr,
                     TO_EVERY_RANK: tl.constexpr):
    """The data is in ``partials`` (copied in on this rank's stream, so before this kernel starts): count
    every tile in, release, at its owner (two-shot) or at every rank (one-shot)."""
    for tile_id in range(tl.program_id(0), total_tiles, COMM_SMS):
        if TO_EVERY_RANK:
            for step in range(world_size):
                device.atomic_add(partial_ready + tile_id, 1, rank, (rank + step) % world_size, heap_bases,
                                  sem="release", scope="sys")
        else:
            device.atomic_add(partial_ready + tile_id, 1, rank, tile_id % world_size, heap_bases, sem="release",
                              scope="sys")


@triton.jit(do_not_specialize=["rank", "epoch", "timeout_ns"])
def one_shot_reduce(out, partials, partial_ready, partials_read, watchdog, heap_bases, rank, world_size, epoch,
                    M, N, timeout_ns, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMM_SMS: tl.constexpr,
                    PEER_CACHE: tl.constexpr):
    """Every tile, on every rank: 1. wait until all W copies are published; 2. sum them in rank order into
    this rank's ``out``; tell each peer its copy was read. 3. Each program then waits until every rank has
    read this rank's copies of its own tiles, so that the launch ends only when ``partials`` may be
    overwritten. (Shared out over the programs: one program waiting for every tile, one flag after another,
    made one-shot 2.8x slower than two-shot at 64-256 MiB on one H200. Under the interpreter program c of
    every rank reads the copies of the tiles of program c of every rank before its waits, so the ranks
    never wait on each other in a circle.)"""
    c = tl.program_id(0)
    total_tiles = tl.cdiv(M, BLOCK_M)
    for tile_id in range(c, total_tiles, COMM_SMS):
        device.wait_at_least(partial_ready + tile_id, world_size * (epoch + 1), timeout_ns, watchdog, rank, tile_id,
                             PARTIAL_READY_FLAG, tile_id)
        tl.debug_barrier()   # every thread reads the copies only after the acquire above
        slot = slot_pointers(partials, tile_id, BLOCK_M, BLOCK_N)
        total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for source in range(world_size):
            total += tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE).to(tl.float32)
        offsets, mask = tile_offsets(tile_id, 0, M, N, N, 1, BLOCK_M, BLOCK_N)
        tl.store(out + offsets, total.to(out.dtype.element_ty), mask=mask)
        tl.debug_barrier()   # every thread has read before anyone says so
        for step in range(world_size):
            device.atomic_add(partials_read + tile_id, 1, rank, (rank + step) % world_size, heap_bases,
                              sem="release", scope="sys")
    for tile_id in range(c, total_tiles, COMM_SMS):
        device.wait_at_least(partials_read + tile_id, world_size * (epoch + 1), timeout_ns, watchdog, rank, tile_id,
                             PARTIALS_READ_FLAG, tile_id)
