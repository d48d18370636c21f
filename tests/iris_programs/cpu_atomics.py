"""Atomics and bf16 arithmetic the interpreter got wrong on cpu ranks: every rank adds 1 into each of rank 0's
32768 counters, 2 programs x 25 times, in fp16, bf16 and fp32 (large blocks, so that ranks' adds overlap in time:
the interpreter's own fp16 add lost some); bf16 sums; fp32 xchg."""

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def add_ones(counters, cur_rank: tl.constexpr, heap_bases, B: tl.constexpr, TIMES: tl.constexpr):
    offsets = tl.arange(0, B)
    for _ in range(TIMES):
        iris.atomic_add(counters + offsets, tl.full((B,), 1.0, counters.dtype.element_ty), cur_rank, 0, heap_bases)


@triton.jit
def bf16_sum(x, out, B: tl.constexpr):
    offsets = tl.arange(0, B)
    acc = tl.zeros((B,), tl.bfloat16)
    for _ in range(3):
        acc += tl.load(x + offsets)
    tl.store(out + offsets, acc * 2 - tl.load(x + offsets))


@triton.jit
def swap_in(flags, old, value, cur_rank: tl.constexpr, heap_bases):
    tl.store(old, iris.atomic_xchg(flags, value, cur_rank, 0, heap_bases, sem="acq_rel", scope="sys"))


shmem = iris.iris(1 << 20)
rank, world = shmem.get_rank(), shmem.get_num_ranks()
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    counters = shmem.zeros(32768, dtype=dtype)
    shmem.barrier()
    add_ones[(2,)](counters, rank, shmem.get_heap_bases(), 32768, 25)
    shmem.barrier()
    if rank == 0:
        print(f"{dtype} counters: {sorted(set(counters.float().tolist()))} (expected [{2 * 25 * world}.0]; bf16 "
              f"counts exactly to 256)")
x = shmem.full((4,), 1.5, dtype=torch.bfloat16)
out = shmem.zeros(4, dtype=torch.bfloat16)
bf16_sum[(1,)](x, out, 4)
print("bf16 3 x 1.5 x 2 - 1.5 =", out.float().tolist())
flags, old = shmem.zeros(1, dtype=torch.float32), shmem.zeros(1, dtype=torch.float32)
shmem.barrier()
swap_in[(1,)](flags, old, float(rank + 1), rank, shmem.get_heap_bases())
shmem.barrier()
print(f"xchg old value {old.item():g}" + (f", final value {flags.item():g}" if rank == 0 else ""))
