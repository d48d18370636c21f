# The package's own versions of the kernel parts the notebooks' puzzles ask for (notebook 1 tile_coords,
# 2 push_partial, 3 reduce_step, 6 sum_partials), and the host's copy of the tile order: what the kernels
# run when no participant's part is given. For instructors and maintainers: the package ships this text
# encoded (gemmar/kernels/puzzle_parts.dat, defined by gemmar/kernels/puzzle_parts.py), so that nothing a
# notebook leads to shows an answer before its check says right (the reveal rule: gemmar/analysis/source.py;
# docs/architecture.md, "The puzzles' answers"). After editing this file, encode it again
# (tests/test_exercises.py checks that the two agree):
#     python -m gemmar.analysis.source instructors/package_parts.py
# Comments, not docstrings: a docstring would be what `?` prints in a notebook.

import triton
import triton.language as tl

from gemmar.kernels import device


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    # tile_id -> (pid_m, pid_n) in grouped order.
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    group = tile_id // tiles_per_group
    first_pid_m = group * GROUP_SIZE_M
    rows_in_group = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)  # the last group may be short
    within = tile_id % tiles_per_group
    return first_pid_m + within % rows_in_group, within // rows_in_group


def host_tile_coords(tile_id, num_pid_m, num_pid_n, gsize_m):
    # The same order on the host, in plain Python (gemmar.analysis.schedule draws and checks with it).
    tiles_per_group = gsize_m * num_pid_n
    group = tile_id // tiles_per_group
    first_pid_m = group * gsize_m
    rows_in_group = min(num_pid_m - first_pid_m, gsize_m)
    within = tile_id % tiles_per_group
    return first_pid_m + within % rows_in_group, within // rows_in_group


@triton.jit
def push_partial(C_tile, acc, mask, step, rank, world_size, heap_bases):
    # Push step `step` (0 .. world_size - 1) of a finished partial tile: add it into one rank's C, and
    # return that rank. Step s goes to rank + 1 + s, so at any moment the ranks are writing to different
    # peers rather than all to rank 0, and after world_size steps every rank (this one last) has it once.
    peer = (rank + 1 + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer


@triton.jit
def reduce_step(total, received):
    # The ring's step 5: add what arrived to our sum, and pass on what arrived (the partial of one more
    # rank back along the ring), not our running sum. Returns (total, next payload).
    return total + received, received


@triton.jit
def sum_partials(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    # two_shot's step 5: the owner's fp32 sum of every rank's partial of one tile (`slot`: the tile's slot
    # in this rank's heap), read in rank order, so that the same inputs always give the same bits.
    total = tl.zeros(slot.shape, tl.float32)
    for source in range(world_size):
        total += tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE).to(tl.float32)
    return total
