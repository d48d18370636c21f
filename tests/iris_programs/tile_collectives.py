"""Iris's tile API (Tile, TileView, make_tensor_view, ctx.<collective>) at an odd shape, each collective checked
against torch: prints ``<collective> <dtype>: max|diff| = X`` per rank, or raises."""

import argparse

import torch
import triton
import triton.language as tl

import iris

parser = argparse.ArgumentParser()
parser.add_argument("-m", type=int, default=100)
parser.add_argument("-n", type=int, default=72)
args = parser.parse_args()
BM, BN = 32, 32


@triton.jit
def reduce_kernel(inp, tmp, out, locks, M, N, context, rank: tl.constexpr, world: tl.constexpr, HOW: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BN)
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * N + cols[None, :]
    data = tl.load(inp + offsets, mask=mask, other=0.0)
    ctx = iris.DeviceContext.initialize(context, rank, world)
    tile = iris.Tile(pid_m, pid_n, BM, BN, data)
    src = iris.make_tensor_view(tmp, M, N, N, 1)
    dst = iris.make_tensor_view(out, M, N, N, 1)
    if HOW == "atomic":
        ctx.all_reduce_atomic(tile, dst)
    elif HOW == "spinlock":
        ctx.all_reduce_spinlock(tile, dst, locks)
    elif HOW == "ring":
        ctx.all_reduce_ring(tile, iris.make_tensor_view(inp, M, N, N, 1), dst)
    else:   # one_shot, two_shot, reduce_scatter: publish the partial, then flag it
        tl.store(tmp + offsets, data, mask=mask)
        tl.debug_barrier()
        tl.atomic_xchg(locks + pid, 1, sem="release", scope="sys")
        if HOW == "one_shot":
            ctx.all_reduce_one_shot(tile, src, dst, locks)
        elif HOW == "two_shot":
            ctx.all_reduce_two_shot(tile, src, dst, locks)
        else:
            ctx.reduce_scatter(tile, src, dst, locks)


@triton.jit
def move_kernel(inp, out, M, N, N_OUT, context, rank: tl.constexpr, world: tl.constexpr, HOW: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N_OUT if HOW == "all_to_all" else N, BN)
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    ctx = iris.DeviceContext.initialize(context, rank, world)
    if HOW == "all_gather":
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        data = tl.load(inp + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < N))
        ctx.all_gather(iris.Tile(pid_m, pid_n, BM, BN, data), iris.make_tensor_view(out, M * world, N, N, 1), 0)
    elif HOW == "gather":
        view = iris.TileView(pid_m, pid_n, BM, BN)
        data = ctx.gather(view, iris.make_tensor_view(inp, M, N, N, 1), (rank + 1) % world)
        rows, cols, mask = view.layout(M, N)
        tl.store(out + rows[:, None] * N + cols[None, :], data, mask=mask)
    else:
        ctx.all_to_all(iris.TileView(pid_m, pid_n, BM, BN), iris.make_tensor_view(inp, M, N_OUT, N_OUT, 1),
                       iris.make_tensor_view(out, M, N_OUT, N_OUT, 1), N)


shmem = iris.iris(1 << 26)
rank, world = shmem.get_rank(), shmem.get_num_ranks()
M, N = args.m, args.n
tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
owners_block = tiles // world


def inputs_of(r, dtype):
    """Rank r's values, on the CPU (each rank makes every rank's, for the expected sums)."""
    g = torch.Generator(device="cpu").manual_seed(r)
    return (torch.randint(-8, 8, (M, N), generator=g, device="cpu") / 4).to(dtype)


for dtype in (torch.float16, torch.bfloat16, torch.float32):
    total = sum(inputs_of(r, torch.float32) for r in range(world))
    for how in ("atomic", "spinlock", "ring", "one_shot", "two_shot", "reduce_scatter"):
        inp = shmem.zeros((M, N), dtype=dtype)
        inp.copy_(inputs_of(rank, dtype))
        tmp, out = shmem.zeros((M, N), dtype=dtype), shmem.zeros((M, N), dtype=dtype)
        locks = shmem.zeros(tiles, dtype=torch.int32)
        shmem.barrier()
        reduce_kernel[(tiles,)](inp, tmp, out, locks, M, N, shmem.get_device_context(), rank, world, how, BM, BN)
        shmem.barrier()
        expected = total.clone()
        if how == "reduce_scatter":   # the owner of a tile (contiguous blocks, the last rank the rest) holds it
            tile_ids = (torch.arange(M)[:, None] // BM) * triton.cdiv(N, BN) + torch.arange(N)[None, :] // BN
            owner = torch.clamp(tile_ids // max(owners_block, 1), max=world - 1) if owners_block else \
                torch.full_like(tile_ids, world - 1)
            expected = torch.where(owner == rank, total, torch.zeros(()))
        print(f"{how} {dtype}: max|diff| = {(out.float().cpu() - expected).abs().max().item():g}")
    inp = shmem.zeros((M, N), dtype=dtype)
    inp.copy_(inputs_of(rank, dtype))
    gathered = shmem.zeros((M * world, N), dtype=dtype)
    shmem.barrier()
    move_kernel[(tiles,)](inp, gathered, M, N, N, shmem.get_device_context(), rank, world, "all_gather", BM, BN)
    shmem.barrier()
    expected = torch.cat([inputs_of(r, dtype) for r in range(world)])
    print(f"all_gather {dtype}: max|diff| = {(gathered.float().cpu() - expected.float()).abs().max().item():g}")
    pulled = shmem.zeros((M, N), dtype=dtype)
    move_kernel[(tiles,)](inp, pulled, M, N, N, shmem.get_device_context(), rank, world, "gather", BM, BN)
    diff = (pulled.float().cpu() - inputs_of((rank + 1) % world, torch.float32)).abs().max().item()
    print(f"gather {dtype}: max|diff| = {diff:g}")
    wide = shmem.zeros((M, N * world), dtype=dtype)
    wide.copy_(torch.cat([inputs_of(10 * rank + c, dtype) for c in range(world)], dim=1))
    swapped = shmem.zeros((M, N * world), dtype=dtype)
    shmem.barrier()
    move_kernel[(triton.cdiv(M, BM) * triton.cdiv(N * world, BN),)](
        wide, swapped, M, N, N * world, shmem.get_device_context(), rank, world, "all_to_all", BM, BN)
    shmem.barrier()
    expected = torch.cat([inputs_of(10 * r + rank, dtype) for r in range(world)], dim=1)
    print(f"all_to_all {dtype}: max|diff| = {(swapped.float().cpu() - expected.float()).abs().max().item():g}")
    shmem.barrier()
