"""An Iris-style handoff with the sanitizer's classic mistakes, one per ``--mistake``: every rank stores a
block into the next rank's heap and raises a flag there; the next rank waits for the flag and checks what
arrived. Under the interpreter all of them give the right values; only the sanitizer tells them apart.

- ``none``: the flag is raised with a release atomic, and awaited with an acquire atomic: right.
- ``plain_flag``: the flag is raised with a plain store (no release).
- ``no_wait``: the receiver reads before it waits for the flag.
- ``no_mask``: the sender's last block has no mask: it writes past the end of the buffer.
- ``bad_rank``: the sender sends to rank ``world_size``, which does not exist.
"""

import argparse

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def send_kernel(source, target, flags, n, me, peer, heap_bases, BLOCK: tl.constexpr, MISTAKE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    values = tl.load(source + offsets, mask=mask)
    if MISTAKE == "no_mask":
        iris.store(target + offsets, values, me, peer, heap_bases)
    else:
        iris.store(target + offsets, values, me, peer, heap_bases, mask=mask)
    if MISTAKE == "plain_flag":
        iris.store(flags + pid, 1, me, peer, heap_bases)
    else:
        iris.atomic_xchg(flags + pid, 1, me, peer, heap_bases, sem="release", scope="sys")


@triton.jit
def receive_kernel(target, flags, wrong, n, me, BLOCK: tl.constexpr, MISTAKE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    if MISTAKE == "no_wait":
        arrived = tl.load(target + offsets, mask=mask)
    while tl.atomic_cas(flags + pid, 1, 1, sem="acquire", scope="sys") != 1:
        pass
    if MISTAKE != "no_wait":
        arrived = tl.load(target + offsets, mask=mask)
    expected = (offsets + 1000 * me).to(tl.float32)
    tl.atomic_add(wrong, tl.sum(((arrived != expected) & mask).to(tl.int32), axis=0))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mistake", default="none", choices=["none", "plain_flag", "no_wait", "no_mask", "bad_rank"])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--block", type=int, default=64)
    args = parser.parse_args()
    shmem = iris.iris(1 << 20)
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    peer = world_size if args.mistake == "bad_rank" else (rank + 1) % world_size
    sender = (rank - 1) % world_size
    source = shmem.zeros(args.n, dtype=torch.float32)
    source.copy_(torch.arange(args.n, dtype=torch.float32) + 1000 * ((rank + 1) % world_size))
    target = shmem.zeros(args.n, dtype=torch.float32)
    blocks = triton.cdiv(args.n, args.block)
    flags = shmem.zeros(blocks, dtype=torch.int32)
    wrong = shmem.zeros(1, dtype=torch.int32)
    shmem.barrier()
    heap_bases = shmem.get_heap_bases()
    send_kernel[(blocks,)](source, target, flags, args.n, rank, peer, heap_bases, args.block, args.mistake)
    receive_kernel[(blocks,)](target, flags, wrong, args.n, rank, args.block, args.mistake)
    shmem.barrier()
    print(f"rank {sender} -> rank {rank}: {args.n - int(wrong.item())} of {args.n} values arrived intact")


if __name__ == "__main__":
    main()
