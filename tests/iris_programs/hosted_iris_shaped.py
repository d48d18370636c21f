"""Run on the Iris-shaped package (tests/iris_shaped) by `gemmar run --iris`: each rank fills a heap buffer, reads
its neighbour's through the package's own device code, and tries the package's ops (which need tritonBLAS)."""

import sys

import torch
import torch.distributed as dist

import iris

dist.init_process_group(backend="gloo")
ctx = iris.iris(heap_size=1 << 20)
rank, world = ctx.cur_rank, ctx.num_ranks
print(f"hip from {type(iris.hip).__name__}: {iris.hip.__doc__.split('(')[0].strip()}")
source = ctx.zeros(8, dtype=torch.float32)
got = ctx.zeros(8, dtype=torch.float32)
source.fill_(float(10 + rank))
ctx.barrier()
peer = (rank + 1) % world
iris.read_from[(1,)](source, got, 8, rank, peer, ctx.heap_bases, BLOCK=8)
print(f"rank {rank} read {got.tolist()} from rank {peer}")
try:
    iris.ops.matmul(source, source)
except Exception as e:  # noqa: BLE001 - the one line gemmar gives
    print(f"ops: {type(e).__name__}: {e}")
ctx.barrier()
sys.exit(0)
