"""Message passing with load and store, in Iris's example style: every rank stores a buffer into the next
rank's heap with iris.store and raises a flag there; the receiver waits for the flag, then reads the
sender's original with iris.load and checks, element by element, that what arrived is what was sent.

    gemmar run -r 2 examples/iris_style/message_passing_load_store.py --buffer_size 200 --block_size 64
"""

import argparse

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def store_kernel(source, target, flags, n_elements, sender, receiver, BLOCK_SIZE: tl.constexpr, heap_bases):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    values = tl.load(source + offsets, mask=mask)
    iris.store(target + offsets, values, sender, receiver, heap_bases, mask=mask)
    iris.atomic_xchg(flags + pid, 1, sender, receiver, heap_bases, sem="release", scope="sys")


@triton.jit
def check_kernel(received, source, flags, mismatches, n_elements, receiver, sender, BLOCK_SIZE: tl.constexpr,
                 heap_bases):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    while tl.atomic_cas(flags + pid, 1, 1, sem="acquire", scope="sys") != 1:
        pass
    arrived = tl.load(received + offsets, mask=mask)
    sent = iris.load(source + offsets, receiver, sender, heap_bases, mask=mask)   # the sender's own copy
    tl.atomic_add(mismatches, tl.sum((arrived != sent).to(tl.int32), axis=0))


def main():
    parser = argparse.ArgumentParser(description="message passing with load and store, in a ring of ranks")
    parser.add_argument("-s", "--buffer_size", type=int, default=4096, help="elements sent by each rank")
    parser.add_argument("-b", "--block_size", type=int, default=512, help="elements per program")
    parser.add_argument("-p", "--heap_size", type=int, default=1 << 30, help="Iris heap size")
    args = parser.parse_args()

    shmem = iris.iris(args.heap_size)
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    if world_size < 2:
        raise ValueError(f"this example needs at least 2 ranks, got {world_size}")
    receiver, sender = (rank + 1) % world_size, (rank - 1) % world_size

    torch.manual_seed(rank)
    source = shmem.randn(args.buffer_size, device="cuda", dtype=torch.float16)
    received = shmem.zeros(args.buffer_size, device="cuda", dtype=torch.float16)
    blocks = triton.cdiv(args.buffer_size, args.block_size)
    flags = shmem.zeros(blocks, device="cuda", dtype=torch.int32)
    mismatches = shmem.zeros(1, device="cuda", dtype=torch.int32)
    shmem.barrier()

    heap_bases = shmem.get_heap_bases()
    store_kernel[(blocks,)](source, received, flags, args.buffer_size, rank, receiver, args.block_size, heap_bases)
    check_kernel[(blocks,)](received, source, flags, mismatches, args.buffer_size, rank, sender, args.block_size,
                            heap_bases)
    shmem.barrier()
    wrong = int(mismatches.item())
    shmem.log(f"rank {sender} -> rank {rank}: {args.buffer_size - wrong} of {args.buffer_size} values arrived intact")
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
