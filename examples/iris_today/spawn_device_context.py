"""A ring of messages with today's Iris launch and device API: the program starts its own ranks with
``torch.multiprocessing.spawn``, joins them with ``dist.init_process_group`` (asking for nccl, as Iris's
examples do), and each rank's kernel sends a block to the next rank through ``DeviceContext`` (store, then a
release on the receiver's flag; the receiver acquire-waits). ``dist`` itself is used too: the ranks compare
what they received with an ``all_gather`` of what was sent.

    gemmar run -r 3 examples/iris_today/spawn_device_context.py --buffer_size 300
"""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import triton
import triton.language as tl

import iris
from iris import DeviceContext


@triton.jit
def send_to_next(context, source, inbox, flags, n, rank: tl.constexpr, world_size: tl.constexpr,
                 BLOCK: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    receiver = (rank + 1) % world_size
    ctx.store(inbox + offsets, tl.load(source + offsets, mask=mask), to_rank=receiver, mask=mask)
    ctx.atomic_xchg(flags + pid, 1, to_rank=receiver, sem="release", scope="sys")


@triton.jit
def wait_for_inbox(context, flags, rank: tl.constexpr, world_size: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    while ctx.atomic_cas(flags + pid, 1, 0, to_rank=rank, sem="acquire", scope="sys") != 1:
        pass


def worker(rank, world_size, init_url, args):
    dist.init_process_group(backend="nccl", init_method=init_url, world_size=world_size, rank=rank,
                            device_id=torch.device(f"cuda:{rank}"))
    shmem = iris.iris(1 << 30)
    assert shmem.get_rank() == dist.get_rank() == rank and shmem.get_num_ranks() == dist.get_world_size()
    n, block = args["buffer_size"], args["block_size"]
    source = shmem.arange(n, dtype=torch.float32) + 1000 * rank
    inbox = shmem.zeros(n, dtype=torch.float32)
    flags = shmem.zeros(triton.cdiv(n, block), dtype=torch.int32)
    context = shmem.get_device_context()
    shmem.barrier()
    grid = (triton.cdiv(n, block),)
    send_to_next[grid](context, source, inbox, flags, n, rank, world_size, block)
    wait_for_inbox[grid](context, flags, rank, world_size)
    sent = [torch.empty(n, dtype=torch.float32) for _ in range(world_size)]
    dist.all_gather(sent, source.cpu())
    sender = (rank - 1) % world_size
    intact = int((inbox.cpu() == sent[sender]).sum())
    shmem.info(f"rank {sender} -> rank {rank}: {intact} of {n} values arrived intact")
    shmem.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description="a ring of messages through DeviceContext, ranks from mp.spawn")
    parser.add_argument("-s", "--buffer_size", type=int, default=1024)
    parser.add_argument("-b", "--block_size", type=int, default=128)
    parser.add_argument("-r", "--num_ranks", type=int, default=2)
    args = vars(parser.parse_args())
    mp.spawn(worker, args=(args["num_ranks"], "tcp://127.0.0.1:29500", args), nprocs=args["num_ranks"], join=True)


if __name__ == "__main__":
    main()
