"""The device API in Iris's rank roles, with Iris's own tests' calls: each rank's data holds its own values, so a
read of the wrong rank's heap shows. Prints one line per check per rank. ``--bad_rank R`` instead puts to rank R."""

import argparse

import torch
import triton
import triton.language as tl

import iris

parser = argparse.ArgumentParser()
parser.add_argument("--bad_rank", type=int, default=None)
args = parser.parse_args()


@triton.jit
def pull_with_get(data, results, cur_rank: tl.constexpr, peer, heap_bases, B: tl.constexpr):
    offsets = tl.arange(0, B)
    # Iris's tests: iris.get(data, results, cur_rank, target_rank, heap_bases) reads target_rank's data
    iris.get(data + offsets, results + offsets, cur_rank, peer, heap_bases, mask=offsets < B - 1, other=0)


@triton.jit
def push_with_put(data, results, cur_rank: tl.constexpr, peer, heap_bases, B: tl.constexpr):
    offsets = tl.arange(0, B)
    iris.put(data + offsets, results + offsets, cur_rank, peer, heap_bases)


@triton.jit
def copy_from_to(data, results, from_rank, to_rank, cur_rank: tl.constexpr, heap_bases, B: tl.constexpr):
    offsets = tl.arange(0, B)
    iris.copy(data + offsets, results + offsets, from_rank, to_rank, cur_rank, heap_bases)


@triton.jit
def context_get(context, data, results, cur_rank: tl.constexpr, world_size: tl.constexpr, peer, B: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, cur_rank, world_size)
    offsets = tl.arange(0, B)
    ctx.get(data + offsets, results + offsets, from_rank=peer)


shmem = iris.iris(1 << 20)
rank, world = shmem.get_rank(), shmem.get_num_ranks()
peer, before = (rank + 1) % world, (rank - 1) % world
B = 8
for dtype in (torch.int8, torch.float16, torch.bfloat16, torch.float32):
    data = shmem.zeros(B, dtype=dtype)
    data.fill_(10 * (rank + 1))
    results = shmem.zeros(B, dtype=dtype)
    shmem.barrier()
    if args.bad_rank is not None:
        push_with_put[(1,)](data, results, rank, args.bad_rank, shmem.get_heap_bases(), B)
    pull_with_get[(1,)](data, results, rank, peer, shmem.get_heap_bases(), B)
    got = results.float().tolist()
    print(f"get {dtype}: {got[0]:g} from rank {peer}'s {10 * (peer + 1)}, masked lane {got[-1]:g}")
    shmem.barrier()
    results.zero_()
    shmem.barrier()
    push_with_put[(1,)](data, results, rank, peer, shmem.get_heap_bases(), B)
    shmem.barrier()
    print(f"put {dtype}: {results.float()[0].item():g} from rank {before}'s {10 * (before + 1)}")
    results.zero_()
    shmem.barrier()
    copy_from_to[(1,)](data, results, peer, rank, rank, shmem.get_heap_bases(), B)   # pull into my results
    print(f"copy {dtype}: {results.float()[0].item():g} from rank {peer}'s {10 * (peer + 1)}")
    results.zero_()
    context_get[(1,)](shmem.get_device_context(), data, results, rank, world, peer, B)
    print(f"ctx.get {dtype}: {results.float()[0].item():g} from rank {peer}'s {10 * (peer + 1)}")
    shmem.barrier()
