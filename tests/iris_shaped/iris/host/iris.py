"""The host class, shaped as Iris's: ranks from torch.distributed, a GPU from the platform module, a SymmetricHeap."""

import torch
import torch.distributed as dist

from iris.host.memory import tensors
from iris.host.memory.symmetric_heap import SymmetricHeap
from iris.host.platform.hip import count_devices, set_device


class Iris:
    def __init__(self, heap_size=1 << 30):
        if not dist.is_initialized():
            raise RuntimeError("PyTorch distributed is not initialized")
        self.cur_rank, self.num_ranks = dist.get_rank(), dist.get_world_size()
        self.gpu_id = self.cur_rank % count_devices()
        set_device(self.gpu_id)
        self.device = f"cuda:{self.gpu_id}"
        self.heap = SymmetricHeap(heap_size, self.gpu_id, self.cur_rank, self.num_ranks)
        self.heap_bases = self.heap.get_heap_bases()

    def zeros(self, *size, dtype=torch.float32):
        count = 1
        for s in size:
            count *= s
        tensors.throw_if_invalid_device(self.device, self.heap.get_device())
        return self.heap.allocate(count, dtype).view(size).zero_()

    def barrier(self):
        dist.barrier()


def iris(heap_size=1 << 30):
    return Iris(heap_size)
