"""Remote atomic add, in Iris's example style: every rank adds rank + 1 to every element of every rank's
counters with iris.atomic_add; after a barrier each rank holds 1 + 2 + ... + W in every element, exactly.

    gemmar run -r 3 examples/iris_style/atomic_add.py --buffer_size 100
"""

import argparse

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def add_everywhere_kernel(counters, n_elements, rank, world_size, BLOCK_SIZE: tl.constexpr, heap_bases):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    for target in range(world_size):
        iris.atomic_add(counters + offsets, rank + 1, rank, target, heap_bases, mask=mask, sem="relaxed",
                        scope="sys")


def main():
    parser = argparse.ArgumentParser(description="every rank atomically adds into every rank's counters")
    parser.add_argument("-s", "--buffer_size", type=int, default=1024, help="counters per rank")
    parser.add_argument("-b", "--block_size", type=int, default=256, help="counters per program")
    args = parser.parse_args()

    shmem = iris.iris(1 << 30)
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    counters = shmem.zeros(args.buffer_size, device="cuda", dtype=torch.int32)
    shmem.barrier()
    grid = (triton.cdiv(args.buffer_size, args.block_size),)
    add_everywhere_kernel[grid](counters, args.buffer_size, rank, world_size, args.block_size,
                                shmem.get_heap_bases())
    shmem.barrier()
    expected = world_size * (world_size + 1) // 2
    values = sorted(set(counters.tolist()))
    shmem.log(f"counters hold {values} (expected [{expected}])")
    if values != [expected]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
