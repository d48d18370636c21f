"""Message passing with put, in Iris's example style: every rank sends a buffer to the next rank (a ring)
with iris.put, then raises a flag in the receiver's heap; the receiver waits for the flag, doubles what it
got and checks it. Runs unchanged on Iris (mpirun -np N) and on gemmar's ranks (gemmar run -r N).

    gemmar run -r 3 examples/iris_style/message_passing_put.py --buffer_size 300 --block_size 64
"""

import argparse

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def send_kernel(source, target, flags, n_elements, sender: tl.constexpr, receiver: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, heap_bases):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    iris.put(source + offsets, target + offsets, sender, receiver, heap_bases, mask=mask)
    # Release: the data above is visible to the receiver before it can see the flag.
    iris.atomic_xchg(flags + pid, 1, sender, receiver, heap_bases, sem="release", scope="sys")


@triton.jit
def receive_kernel(buffer, flags, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    # Acquire: once the flag reads 1, the sender's data is visible to the loads below.
    while tl.atomic_cas(flags + pid, 1, 1, sem="acquire", scope="sys") != 1:
        pass
    values = tl.load(buffer + offsets, mask=mask)
    tl.store(buffer + offsets, values * 2, mask=mask)


def parse_args():
    parser = argparse.ArgumentParser(description="message passing with put, in a ring of ranks")
    parser.add_argument("-s", "--buffer_size", type=int, default=4096, help="elements sent by each rank")
    parser.add_argument("-b", "--block_size", type=int, default=512, help="elements per program")
    parser.add_argument("-p", "--heap_size", type=int, default=1 << 30, help="Iris heap size")
    return parser.parse_args()


def main():
    args = parse_args()
    shmem = iris.iris(args.heap_size)
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    if world_size < 2:
        raise ValueError(f"this example needs at least 2 ranks, got {world_size}")
    receiver, sender = (rank + 1) % world_size, (rank - 1) % world_size

    source = shmem.arange(args.buffer_size, device="cuda", dtype=torch.float32) + 1000 * rank
    received = shmem.zeros(args.buffer_size, device="cuda", dtype=torch.float32)
    blocks = triton.cdiv(args.buffer_size, args.block_size)
    flags = shmem.zeros((blocks,), device="cuda", dtype=torch.int32)
    shmem.barrier()

    send_kernel[(blocks,)](source, received, flags, args.buffer_size, rank, receiver, args.block_size,
                           shmem.get_heap_bases())
    receive_kernel[(blocks,)](received, flags, args.buffer_size, args.block_size)
    shmem.barrier()

    expected = (torch.arange(args.buffer_size, dtype=torch.float32, device="cuda") + 1000 * sender) * 2
    wrong = int((received != expected).sum())
    shmem.log(f"received {args.buffer_size} values from rank {sender}: "
              f"{'Validation successful.' if wrong == 0 else f'Validation failed: {wrong} wrong'}")
    shmem.barrier()
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
