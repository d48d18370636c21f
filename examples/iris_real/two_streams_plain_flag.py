"""Iris's example 15 pattern on gemmar's ranks: a GEMM kernel and a communication kernel on two streams, the
"tile done" flag between them raised with a plain store.

Iris's example 15 (examples/15_gemm_all_reduce_ring_based, main abd3f2a) stores each finished tile, then
``tl.store(locks + tile_id, 1)``; the communication kernel, on another stream, polls the lock with an acquire and
sends the tile. A plain store orders nothing: on a GPU the flag may be seen before the tile. This program has the
same shape with Iris's device API (a GEMM tile per program on one stream; on the other, a push of each finished
tile into every rank's C with ``iris.atomic_add``).

    gemmar run -r 2 --backend cpu --sanitize --iris IRIS_CHECKOUT examples/iris_real/two_streams_plain_flag.py
    ... --fix release   (the flag raised with a release atomic: the sanitizer finds nothing)

cpu ranks run the two streams one after the other, so C comes out right either way; the sanitizer orders the
streams as a GPU would and names the plain store.
"""

import argparse
import os

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris


@triton.jit
def gemm_tiles(A, B, local_C, locks, M, N, K, BLOCK: tl.constexpr, RELEASE: tl.constexpr):
    tile_id = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK)
    rows = (tile_id // tiles_n) * BLOCK + tl.arange(0, BLOCK)
    cols = (tile_id % tiles_n) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(0, K, BLOCK):
        ks = k + tl.arange(0, BLOCK)
        a = tl.load(A + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(B + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(local_C + rows[:, None] * N + cols[None, :], acc, mask=mask)
    if RELEASE:
        tl.atomic_xchg(locks + tile_id, 1, sem="release", scope="gpu")
    else:
        tl.store(locks + tile_id, 1)   # example 15's flag


@triton.jit
def push_tiles(local_C, C, locks, M, N, heap_bases, rank: tl.constexpr, world_size: tl.constexpr,
               BLOCK: tl.constexpr):
    tile_id = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK)
    rows = (tile_id // tiles_n) * BLOCK + tl.arange(0, BLOCK)
    cols = (tile_id % tiles_n) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * N + cols[None, :]
    while tl.atomic_cas(locks + tile_id, 1, 1, sem="acquire", scope="gpu") != 1:
        pass
    partial = tl.load(local_C + offsets, mask=mask)
    for peer in range(world_size):
        iris.atomic_add(C + offsets, partial, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", choices=("none", "release"), default="none")
    parser.add_argument("-m", type=int, default=32)
    parser.add_argument("-n", type=int, default=32)
    parser.add_argument("-k", type=int, default=32)
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="gloo")
    ctx = iris.iris(heap_size=1 << 24)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    BLOCK = 16
    M, N, K = args.m, args.n, args.k
    tiles = triton.cdiv(M, BLOCK) * triton.cdiv(N, BLOCK)
    generator = torch.Generator().manual_seed(rank)
    A = ctx.zeros((M, K), dtype=torch.float32)
    B = ctx.zeros((K, N), dtype=torch.float32)
    A.copy_(torch.randn(M, K, generator=generator))
    B.copy_(torch.randn(K, N, generator=generator))
    local_C = ctx.zeros((M, N), dtype=torch.float32)
    C = ctx.zeros((M, N), dtype=torch.float32)
    locks = ctx.zeros((tiles,), dtype=torch.int32)
    ctx.barrier()
    gemm_stream, comm_stream = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(gemm_stream):
        gemm_tiles[(tiles,)](A, B, local_C, locks, M, N, K, BLOCK, args.fix == "release")
    with torch.cuda.stream(comm_stream):
        push_tiles[(tiles,)](local_C, C, locks, M, N, ctx.get_heap_bases(), rank, world, BLOCK)
    torch.cuda.synchronize()
    ctx.barrier()
    expected = torch.zeros(M, N, dtype=torch.float64)
    mine = (A.double() @ B.double())
    dist.all_reduce(mine)
    expected += mine
    diff = (C.double() - expected).abs().max().item()
    print(f"max |C - sum of A_r @ B_r| = {diff:.2g}: {'right' if diff < 1e-3 else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    raise SystemExit(0 if diff < 1e-3 else 1)


if __name__ == "__main__":
    main()
