"""Today's Iris host API on gemmar's ranks: each rank prints one line per check, ``name: value``."""

import torch
import torch.distributed as dist

import iris

dist.init_process_group(backend="gloo")
shmem = iris.iris(1 << 20)
rank, W = shmem.get_rank(), shmem.get_num_ranks()
last = W - 1
print(f"ranks: {rank} {W} {shmem.cur_rank} {shmem.num_ranks} {dist.get_rank()} {dist.get_world_size()}")
print(f"broadcast int from last: {shmem.broadcast(40 + rank, src=last)}")
print(f"broadcast float, old name: {shmem.broadcast(0.5 * (rank + 1), source_rank=0)}")
print(f"broadcast object: {shmem.broadcast({'from': rank, 'text': 'héllo'} if rank == last else None, src=last)}")
array = shmem.broadcast(torch.arange(5) * (rank + 1) if rank == 1 else None, src=1)
print(f"broadcast tensor: {type(array).__name__} {array.tolist()}")
print(f"zeros default dtype: {shmem.zeros(3).dtype}; full dtype: {shmem.full((2,), 7).dtype} "
      f"{shmem.full((2,), 7.5).dtype}; rand: {shmem.rand(4).dtype}")
context = shmem.get_device_context()
print(f"device context: {context.dtype} {tuple(context.shape)} {context[:2].tolist()} "
      f"{torch.equal(context[2:2 + shmem.get_num_ranks()], shmem.get_heap_bases())} {context[-3:].tolist()}")
print(f"symmetric: {shmem.is_symmetric(shmem.zeros(8))} {shmem.is_symmetric(torch.zeros(8))}")
print(f"hip: {iris.hip.get_num_xcc()} {iris.hip.get_wall_clock_rate(rank)} {iris.hip.get_cu_count() >= 1}")
shmem.info("info shown")
shmem.debug("debug hidden at the default level")
shmem.warning("warning shown")
shmem.log("the old log")
iris.set_logger_level(iris.DEBUG)
shmem.debug("debug shown after set_logger_level")
iris.set_logger_level(iris.INFO)
shmem.barrier()
shmem.device_barrier()
dist.barrier()
try:
    shmem.as_symmetric(torch.zeros(4))
except Exception as e:  # noqa: BLE001 - the refusal is what is printed
    print(f"as_symmetric: {type(e).__name__}")
try:
    shmem.zeros(4, pin_memory=True)   # (a keyword Iris's zeros does not take: refused, not swallowed)
except Exception as e:  # noqa: BLE001 - the refusal is what is printed
    print(f"zeros: {type(e).__name__}: {e}")
dist.destroy_process_group()
