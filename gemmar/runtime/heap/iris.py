"""The iris backend: real Iris (ROCm) owns the symmetric heap; gemmar allocates its arena inside it.

UNTESTED on hardware: no AMD GPU was available. What is tested (tests/test_iris_backend.py) is the
choice of backend and the calls made into Iris. Iris allocates every tensor at the same offset on every
rank, so an arena taken from Iris is symmetric, and Iris's own heap bases translate pointers into it:
``device.translate`` only uses differences between bases. The kernels read the AMD clock
(``s_memrealtime``) through ``device.now``.
"""

import os

import torch

from .base import SymmetricHeap


class IrisHeap(SymmetricHeap):
    backend = "iris"

    @classmethod
    def create(cls, rank, world_size, size, folder, timeout_s=60.0, port=29531):
        import iris

        # Iris initialises torch.distributed from the usual environment variables.
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.cuda.set_device(rank)
        shmem = iris.iris(heap_size=size + (64 << 20))  # room for Iris's own bookkeeping
        arena = shmem.zeros(size, dtype=torch.uint8)
        bases = shmem.get_heap_bases().to(torch.int64)
        heap = cls(rank, world_size, arena, bases, arena.device, timeout_s)
        heap._iris = shmem
        heap.barrier()
        return heap

    def synchronize(self):
        torch.cuda.synchronize(self.device)
