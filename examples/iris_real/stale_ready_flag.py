"""Iris issue #465 on gemmar's ranks: a "tile ready" flag signalled with the constant 1 lets the next call read
the last call's tile.

Iris's ``DeviceContext.all_reduce_one_shot`` (iris/mem/triton/context.py, Iris main abd3f2a) waits until each
peer's lock for the tile reads 1, and producers set it to 1. A workspace used again without zeroing its locks
already reads 1: a consumer that runs ahead of a peer takes the peer's partial of the *previous* call.

    gemmar run -r 2 --backend cpu --sanitize --iris IRIS_CHECKOUT examples/iris_real/stale_ready_flag.py
    ... --fix zero_locks    (Iris's own way: the preamble zeroes the locks, ranks meet, then the kernel)
    ... --fix per_call      (a per-call signal value, as Iris PR #529 proposes: wait for this call's number)

Rank 1 is late for the second call (it sleeps, as a rank busy with other work would). Without a fix rank 0's
result is wrong and the sanitizer names the race: rank 0 reads rank 1's ``staging`` after an acquire of
``locks`` that saw the first call's release. Exit 1 when a result is wrong.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris


@triton.jit
def publish_then_reduce(source, staging, result, locks, M, N, context, call, rank: tl.constexpr,
                        world_size: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PER_CALL: tl.constexpr):
    tile_id = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_id // tiles_n, tile_id % tiles_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * N + cols[None, :]
    mine = tl.load(source + offsets, mask=mask, other=0.0)
    # Publish this rank's partial where peers read it, then say so.
    tl.store(staging + offsets, mine, mask=mask)
    tl.debug_barrier()
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    if PER_CALL:
        tl.atomic_xchg(locks + tile_id, call, sem="release", scope="sys")
        total = mine.to(tl.float32)
        for peer in range(world_size):
            if peer != rank:
                # Wait for *this* call's signal: a value left by an earlier call is smaller.
                while ctx.atomic_add(locks + tile_id, 0, to_rank=peer, sem="acquire", scope="sys") < call:
                    pass
                total += ctx.load(staging + offsets, from_rank=peer, mask=mask).to(tl.float32)
        tl.store(result + offsets, total.to(result.dtype.element_ty), mask=mask)
    else:
        # Iris's own producer signal and consumer (the constant 1 of issue #465).
        tl.atomic_xchg(locks + tile_id, 1, sem="release", scope="sys")
        tile = iris.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, mine)
        ctx.all_reduce_one_shot(tile, iris.make_tensor_view(staging, M, N, N, 1),
                                iris.make_tensor_view(result, M, N, N, 1), locks)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", choices=("none", "zero_locks", "per_call"), default="none")
    parser.add_argument("-m", type=int, default=32)
    parser.add_argument("-n", type=int, default=32)
    parser.add_argument("--late_s", type=float, default=1.0, help="how late rank 1 is for the second call")
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="gloo")
    ctx = iris.iris(heap_size=1 << 24)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    BLOCK_M = BLOCK_N = 16
    tiles = triton.cdiv(args.m, BLOCK_M) * triton.cdiv(args.n, BLOCK_N)
    source = ctx.zeros((args.m, args.n), dtype=torch.float32)
    staging = ctx.zeros((args.m, args.n), dtype=torch.float32)
    result = ctx.zeros((args.m, args.n), dtype=torch.float32)
    locks = ctx.zeros((tiles,), dtype=torch.int32)   # zeroed once, as a workspace made by a preamble is
    wrong = 0
    for call in (1, 2):
        source.fill_(float(10 * call + rank))       # call 1: 0 and 1; call 2: 20 and 21 (2 ranks)
        if args.fix == "zero_locks":
            locks.zero_()
        ctx.barrier()
        if rank == 1 and call == 2:
            time.sleep(args.late_s)                  # a straggler: busy elsewhere before its second call
        publish_then_reduce[(tiles,)](source, staging, result, locks, args.m, args.n, ctx.get_device_context(), call,
                                      rank, world, BLOCK_M, BLOCK_N, args.fix == "per_call")
        torch.cuda.synchronize()
        expected = sum(10 * call + r for r in range(world))
        got = result.flatten()[0].item()
        bad = int((result != expected).sum().item())
        wrong += bool(bad)
        print(f"call {call}: C[0, 0] = {got:g}, expected {expected:g}: "
              f"{'right' if not bad else f'WRONG in {bad} of {result.numel()} elements'}", flush=True)
        ctx.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
