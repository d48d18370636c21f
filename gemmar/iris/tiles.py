"""Iris's tile API: one tile of a 2-D tensor at a time, and the collectives a ``DeviceContext`` runs on it.

In a kernel, as Iris's programs write it::

    tile = iris.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc)      # where the tile is, how big, and its data
    view = iris.make_tensor_view(C, M, N, stride_m, stride_n)  # a 2-D tensor in the symmetric heap
    ctx.all_reduce_atomic(tile, view)                          # every rank's C[tile] += acc

- ``TileView(pid_m, pid_n, block_m, block_n)``: a tile's place and size (no data): for ``gather`` and
  ``all_to_all``, which read rather than send.
- ``TensorView``: pointer, shape and strides; ``view.tile_ptr(tile)`` gives the tile's pointers and the mask of
  its elements inside the tensor (edge tiles are partial).
- ``ctx.all_reduce_atomic / _spinlock / _one_shot / _two_shot / _ring``, ``all_gather``, ``gather``,
  ``all_to_all``, ``reduce_scatter``: the functions below, as methods of gemmar's ``DeviceContext``.

Sums of fp16 tiles are taken in fp32; other dtypes are summed in their own (as Iris does). The waits on a peer's
``locks[tile]`` (one_shot, two_shot, reduce_scatter: the peer's kernel sets it when its partial is in place, and
the spinlock) pause between polls; under the interpreter they give up after the rank's timeout with a
``DeadlockError`` naming the rank, the tile, the flag and the peer, instead of spinning for ever.
"""

import time

import triton
import triton.language as tl

from ..errors import DeadlockError
from ..kernels.device import INTERPRETER, host_int, now, pause
from ..kernels.triton_support import device_aggregate
from . import this_rank

# Reports (the sanitizer's, a bad rank's) name the kernel line that called this module, not a line of it.
REPORTS_NAME_THE_LINE_THAT_CALLS_THIS_MODULE = True


@triton.jit
def _tile_pointers(ptr, M, N, stride_m, stride_n, rows, cols):
    mask = (rows[:, None] < M) & (cols[None, :] < N) & (rows[:, None] >= 0) & (cols[None, :] >= 0)
    return ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask


@triton.jit
def _indices(tile):
    return (tile.pid_m * tile.block_m + tl.arange(0, tile.block_m),
            tile.pid_n * tile.block_n + tl.arange(0, tile.block_n))


@triton.jit
def _layout(tile, M, N):
    rows, cols = _indices(tile)
    return rows, cols, (rows[:, None] < M) & (cols[None, :] < N)


@device_aggregate
class TileView:
    """A tile's coordinates (in tiles) and its size (in elements)."""

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)

    @triton.jit
    def indices(self):
        """The tile's rows and columns (not clipped to any tensor)."""
        return _indices(self)

    @triton.jit
    def layout(self, M, N):
        """rows, columns, and the mask of those inside an M x N tensor."""
        return _layout(self, M, N)


@device_aggregate
class Tile:
    """A tile with its data (e.g. a GEMM's accumulator): what a collective sends."""

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr
    data: tl.tensor

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n, data):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)
        self.data = data

    @triton.jit
    def indices(self):
        return _indices(self)

    @triton.jit
    def layout(self, M, N):
        return _layout(self, M, N)


@device_aggregate
class TensorView:
    """A 2-D tensor: its pointer (in this rank's heap, for remote access), shape and strides."""

    ptr: tl.tensor
    M: tl.tensor
    N: tl.tensor
    stride_m: tl.tensor
    stride_n: tl.tensor

    @triton.constexpr_function
    def __init__(self, ptr, M, N, stride_m, stride_n):
        self.ptr = ptr
        self.M = M
        self.N = N
        self.stride_m = stride_m
        self.stride_n = stride_n

    @triton.jit
    def tile_ptr(self, tile):
        """The tile's element pointers and the mask of those inside the tensor."""
        rows, cols = tile.indices()
        return _tile_pointers(self.ptr, self.M, self.N, self.stride_m, self.stride_n, rows, cols)

    @triton.jit
    def tile_ptr_from_indices(self, rows, cols, block_m: tl.constexpr, block_n: tl.constexpr):
        return _tile_pointers(self.ptr, self.M, self.N, self.stride_m, self.stride_n, rows, cols)

    @triton.jit
    def offset_tile_ptr(self, tile, offset_m=0, offset_n=0, src_mask=None):
        """The tile moved by (offset_m, offset_n) elements; ``src_mask`` narrows the mask further."""
        rows, cols = tile.indices()
        pointers, mask = _tile_pointers(self.ptr, self.M, self.N, self.stride_m, self.stride_n, rows + offset_m,
                                        cols + offset_n)
        if src_mask is not None:
            mask = mask & src_mask
        return pointers, mask

    @triton.jit
    def offset(self, offset_m=0, offset_n=0):
        return TensorView(self.ptr + offset_m * self.stride_m + offset_n * self.stride_n, self.M, self.N,
                          self.stride_m, self.stride_n)

    @triton.jit
    def number_of_tiles(self, block_m, block_n):
        return tl.cdiv(self.M, block_m) * tl.cdiv(self.N, block_n)


@triton.jit
def make_tensor_view(ptr, M, N, stride_m, stride_n):
    """A :class:`TensorView` in a kernel (shape and strides may be ints, constexprs or tensors: its fields are
    tensors)."""
    zero = tl.zeros((), tl.int32)
    return TensorView(ptr, M + zero, N + zero, stride_m + zero, stride_n + zero)


# -- waiting on a peer's flag ------------------------------------------------------------------------------
def _waited_too_long(start_ns, rank, peer, tile_id, flag, expected, seen):
    """Under the interpreter: raise DeadlockError once a wait has lasted the rank's timeout."""
    heap = this_rank.heap
    timeout_s = heap.timeout_s if heap is not None else 60.0
    if time.monotonic_ns() - host_int(start_ns) > timeout_s * 1e9:
        raise DeadlockError([dict(rank=host_int(rank), program=host_int(tl.program_id(0)), tile=host_int(tile_id),
                                  flag=f"{flag} of rank {host_int(peer)}", index=host_int(tile_id), expected=expected,
                                  seen=host_int(seen))])


_waited_too_long.__triton_builtin__ = True


@triton.jit
def _wait_for_flag(ctx, flag, peer, tile_id, scope: tl.constexpr):
    """Spin until ``peer``'s ``*flag == 1`` (acquire)."""
    if INTERPRETER:
        start = now()   # (under the interpreter: the host's monotonic clock, as _waited_too_long reads)
    seen = ctx.atomic_add(flag, 0, to_rank=peer, sem="acquire", scope=scope)
    while seen != 1:
        pause()
        if INTERPRETER:
            _waited_too_long(start, ctx.rank, peer, tile_id, "locks", 1, seen)
        seen = ctx.atomic_add(flag, 0, to_rank=peer, sem="acquire", scope=scope)


@triton.jit
def _acquire_lock(ctx, lock, peer, tile_id):
    """Take ``peer``'s ``*lock`` (0 -> 1)."""
    if INTERPRETER:
        start = now()   # (under the interpreter: the host's monotonic clock, as _waited_too_long reads)
    seen = ctx.atomic_cas(lock, 0, 1, to_rank=peer, sem="acquire", scope="sys")
    while seen != 0:
        pause()
        if INTERPRETER:
            _waited_too_long(start, ctx.rank, peer, tile_id, "lock", 0, seen)
        seen = ctx.atomic_cas(lock, 0, 1, to_rank=peer, sem="acquire", scope="sys")


@triton.constexpr_function
def _sum_type(dtype):
    return tl.float32 if dtype == tl.float16 else dtype


@triton.jit
def _tile_id(tile, view):
    return tile.pid_m * tl.cdiv(view.N, tile.block_n) + tile.pid_n


# -- the collectives -------------------------------------------------------------------------------------
@triton.jit
def all_reduce_atomic(ctx, tile, dst_view):
    """Every rank's ``dst[tile] += tile.data`` by atomic adds (dst starts at zero on every rank)."""
    pointers, mask = dst_view.tile_ptr(tile)
    for peer in range(ctx.world_size):
        ctx.atomic_add(pointers, tile.data, to_rank=peer, mask=mask)


@triton.jit
def all_reduce_spinlock(ctx, tile, dst_view, locks):
    """Every rank's ``dst[tile] += tile.data`` under that rank's ``locks[tile]``: read, add, write, release."""
    pointers, mask = dst_view.tile_ptr(tile)
    tile_id = _tile_id(tile, dst_view)
    SUM: tl.constexpr = _sum_type(tile.data.dtype)
    for peer in range(ctx.world_size):
        _acquire_lock(ctx, locks + tile_id, peer, tile_id)
        current = ctx.load(pointers, from_rank=peer, mask=mask)
        ctx.store(pointers, (current.to(SUM) + tile.data.to(SUM)).to(tile.data.dtype), to_rank=peer, mask=mask)
        tl.debug_barrier()   # every thread's store is part of what the release publishes
        ctx.atomic_xchg(locks + tile_id, 0, to_rank=peer, sem="release", scope="sys")


@triton.jit
def _sum_from_peers(ctx, tile, src_view, locks, scope: tl.constexpr):
    """tile.data plus every peer's src[tile], each read once that peer's ``locks[tile]`` says it is there."""
    pointers, mask = src_view.tile_ptr(tile)
    tile_id = _tile_id(tile, src_view)
    SUM: tl.constexpr = _sum_type(tile.data.dtype)
    total = tile.data.to(SUM)
    for peer in range(ctx.world_size):
        if peer != ctx.rank:
            _wait_for_flag(ctx, locks + tile_id, peer, tile_id, scope)
            total += ctx.load(pointers, from_rank=peer, mask=mask).to(SUM)
    return total.to(tile.data.dtype)


@triton.jit
def all_reduce_one_shot(ctx, tile, src_view, dst_view, locks):
    """This rank's ``dst[tile]`` = its data + every peer's ``src[tile]`` (each peer sets its ``locks[tile]`` to 1
    once its partial is in its ``src``)."""
    pointers, mask = dst_view.tile_ptr(tile)
    tl.store(pointers, _sum_from_peers(ctx, tile, src_view, locks, "sys"), mask=mask)


@triton.jit
def all_reduce_two_shot(ctx, tile, src_view, dst_view, locks):
    """The tile's owner (``tile_id % world_size``) sums every rank's partial and writes it into every rank's
    ``dst``; other ranks do nothing for this tile."""
    tile_id = _tile_id(tile, dst_view)
    if tile_id % ctx.world_size == ctx.rank:
        total = _sum_from_peers(ctx, tile, src_view, locks, "sys")
        pointers, mask = dst_view.tile_ptr(tile)
        for peer in range(ctx.world_size):
            ctx.store(pointers, total, to_rank=peer, mask=mask)


@triton.jit
def all_reduce_ring(ctx, tile, src_view, dst_view):
    """This rank's ``dst[tile]`` = the sum of every rank's ``src[tile]``, read rank after rank around the ring
    (the caller makes sure every ``src`` is complete first, e.g. with a barrier)."""
    src, mask = src_view.tile_ptr(tile)
    dst, _ = dst_view.tile_ptr(tile)
    mine = tl.load(src, mask=mask, other=0.0)
    SUM: tl.constexpr = _sum_type(mine.dtype)
    total = mine.to(SUM)
    for step in range(1, ctx.world_size):
        total += ctx.load(src, from_rank=(ctx.rank + ctx.world_size - step) % ctx.world_size, mask=mask).to(SUM)
    tl.store(dst, total.to(mine.dtype), mask=mask)


@triton.jit
def all_gather(ctx, tile, dst_view, dim: tl.constexpr):
    """Write this rank's tile into block ``rank`` of every rank's ``dst`` (blocks stacked along ``dim``: rows for
    0, columns for 1). The tile is clipped to this rank's block, so a partial edge tile never spills into the
    next rank's."""
    rows, cols = tile.indices()
    if dim == 0:
        block = dst_view.M // ctx.world_size
        inside = (rows[:, None] < block) & (cols[None, :] < dst_view.N)
        pointers, mask = dst_view.offset_tile_ptr(tile, offset_m=ctx.rank * block, src_mask=inside)
    else:
        block = dst_view.N // ctx.world_size
        inside = (rows[:, None] < dst_view.M) & (cols[None, :] < block)
        pointers, mask = dst_view.offset_tile_ptr(tile, offset_n=ctx.rank * block, src_mask=inside)
    for peer in range(ctx.world_size):
        ctx.store(pointers, tile.data, to_rank=peer, mask=mask)


@triton.jit
def gather(ctx, tile, src_view, source_rank: tl.constexpr, hint: tl.constexpr = None):
    """``source_rank``'s ``src[tile]`` (0 outside the tensor)."""
    pointers, mask = src_view.tile_ptr(tile)
    return ctx.load(pointers, from_rank=source_rank, mask=mask, other=0.0, hint=hint)


@triton.jit
def all_to_all(ctx, tile, src_view, dst_view, N_per_rank: tl.constexpr):
    """Column block ``r`` of this rank's ``dst`` = column block ``rank`` of rank ``r``'s ``src`` (blocks of
    ``N_per_rank`` columns). Each column of the tile comes from the rank whose block it is in."""
    rows, cols = tile.indices()
    dst, dst_mask = _tile_pointers(dst_view.ptr, dst_view.M, dst_view.N, dst_view.stride_m, dst_view.stride_n,
                                   rows, cols)
    source_cols = ctx.rank * N_per_rank + cols % N_per_rank
    src, src_mask = _tile_pointers(src_view.ptr, src_view.M, src_view.N, src_view.stride_m, src_view.stride_n,
                                   rows, source_cols)
    for peer in range(ctx.world_size):
        mask = dst_mask & src_mask & ((cols // N_per_rank) == peer)[None, :]
        tl.store(dst, ctx.load(src, from_rank=peer, mask=mask), mask=mask)


@triton.jit
def reduce_scatter(ctx, tile, src_view, dst_view, locks):
    """Tiles are dealt out in contiguous blocks (rank r: tiles ``r * T // W`` ...; the last rank takes the rest);
    the tile's owner sums every rank's partial into its own ``dst``. Others do nothing for this tile."""
    total_tiles = tl.cdiv(dst_view.M, tile.block_m) * tl.cdiv(dst_view.N, tile.block_n)
    per_rank = total_tiles // ctx.world_size
    tile_id = _tile_id(tile, dst_view)
    owner = tl.minimum(tile_id // tl.maximum(per_rank, 1), ctx.world_size - 1)
    if per_rank == 0:
        owner = ctx.world_size - 1
    if owner == ctx.rank:
        total = _sum_from_peers(ctx, tile, src_view, locks, "gpu")
        pointers, mask = dst_view.tile_ptr(tile)
        tl.store(pointers, total, mask=mask)
