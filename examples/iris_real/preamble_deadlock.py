"""Iris issue #464 on gemmar's ranks: a preamble whose allocation is collective, reached by only some ranks.

Iris's ``all_reduce_preamble`` (iris/ccl/triton/all_reduce.py, main abd3f2a) allocates a workspace's buffers
when the workspace it is given has none of the right shape, and only resets them otherwise. Allocating on Iris's
heap is collective (every rank meets in it), resetting is not. So when one rank's workspace must be made anew
(here rank 0 dropped its own, as a per-rank cache would) and the others' need not, rank 0 waits in the allocation
for ranks that went on into the ring kernel, where they wait for rank 0's flags: a deadlock.

    gemmar run -r 2 --backend cpu --timeout 30 --iris IRIS_CHECKOUT examples/iris_real/preamble_deadlock.py
    ... --fix agree   (the ranks first agree whether anyone needs a new workspace; then all make one, or none)

At the deadline gemmar names where each rank waits: rank 0 in the allocation the preamble makes, rank 1 in the
ring kernel's wait. With ``--fix agree`` both calls are right.
"""

import argparse
import os

import torch
import torch.distributed as dist

import iris
from iris.ccl import Config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", choices=("none", "agree"), default="none")
    parser.add_argument("-m", type=int, default=32)
    parser.add_argument("-n", type=int, default=64)
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="gloo")
    ctx = iris.iris(heap_size=1 << 24)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    config = Config(all_reduce_variant="ring", block_size_m=16, block_size_n=32, comm_sms=2)
    source = ctx.zeros((args.m, args.n), dtype=torch.float32)
    result = ctx.zeros((args.m, args.n), dtype=torch.float32)
    workspace = None
    for call in (1, 2):
        source.fill_(float(10 * call + rank))
        if call == 2 and rank == 0:
            workspace = None                      # rank 0's own cache dropped its workspace; the others kept theirs
        if args.fix == "agree":
            # Whether anyone must allocate is decided together, so that all ranks take the same path.
            anyone = torch.tensor([int(workspace is None)])
            dist.all_reduce(anyone)
            if anyone.item():
                workspace = None
        workspace = ctx.ccl.all_reduce_preamble(result, source, config=config, workspace=workspace)
        workspace = ctx.ccl.all_reduce(result, source, config=config, workspace=workspace)
        torch.cuda.synchronize()
        expected = sum(10 * call + r for r in range(world))
        print(f"call {call}: C[0, 0] = {result[0, 0].item():g}, expected {expected:g}", flush=True)
        ctx.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
