"""Solutions to the notebooks' puzzles, for instructors (kept out of notebooks/, which participants browse).

Each is a complete @triton.jit function that the notebook's check accepts; ``tests/test_exercises.py``
proves that it passes and that the stub in the notebook does not.
"""

import triton
import triton.language as tl

from gemmar.kernels import device


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Notebook 1: grouped order. A group is GROUP_SIZE_M tile-rows wide; inside it ids walk down a column."""
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_row = (tile_id // tiles_per_group) * GROUP_SIZE_M
    rows = tl.minimum(num_pid_m - first_row, GROUP_SIZE_M)   # the last group may be short
    within = tile_id % tiles_per_group
    return first_row + within % rows, within // rows


@triton.jit
def push_partial(C_tile, acc, mask, step, rank, world_size, heap_bases):
    """Notebook 2: step s goes to a different rank for each s, the rank's own C included."""
    peer = (rank + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer


@triton.jit
def reduce_step(total, received):
    """Notebook 3: add what arrived, and pass on what arrived (not the running sum)."""
    return total + received, received


@triton.jit
def sum_partials(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    """Notebook 6: the owner reads the tile's slot in every rank's heap, in rank order, and adds in fp32."""
    total = tl.zeros(slot.shape, tl.float32)
    for source in range(world_size):
        total += tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE).to(tl.float32)
    return total
