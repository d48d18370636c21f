"""A host fill against a peer's kernel, for the sanitizer: rank 0's kernel stores a block into rank 1's ``target``
and raises rank 1's ``flags[0]``; rank 1 zero-fills both on the host (``shmem.zeros``, ``zero_``). With
``--barrier`` the ranks meet between the fills and the kernel's launch; without it nothing orders the two (on a
GPU the kernel's flag may be zeroed after it was raised, and the receiver waits for ever), whichever ran first here.

The ranks meet at the end on the host (``dist.barrier``), not with a second ``shmem.barrier``: the heap barrier's
counter only grows, so a rank still leaving the first heap barrier could read the second one's arrival and be
ordered after everything its peer did before it, the kernel included - an order this run would then really have
had, and the race would go unseen (it did, once in a few runs, under load).
"""

import argparse

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris


@triton.jit
def send_kernel(target, flags, n, me, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    iris.store(target + offsets, offsets.to(tl.float32), me, peer, heap_bases, mask=mask)
    iris.atomic_xchg(flags, 1, me, peer, heap_bases, sem="release", scope="sys")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--barrier", action="store_true")
    args = parser.parse_args()
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    shmem = iris.iris(1 << 20)
    rank = shmem.get_rank()
    target = shmem.empty(64, dtype=torch.float32)
    shmem.barrier()
    flags = shmem.zeros(1, dtype=torch.int32)   # (on every rank: an allocation is collective)
    if rank == 1:
        target.zero_()
    if args.barrier:
        shmem.barrier()
    if rank == 0:
        send_kernel[(1,)](target, flags, 64, 0, 1, shmem.get_heap_bases(), BLOCK=64)
    dist.barrier()   # (rank 1's heap lives until rank 0's kernel has written it)


if __name__ == "__main__":
    main()
