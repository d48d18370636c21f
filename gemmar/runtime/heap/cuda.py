"""The cuda backend of the symmetric heap, in two layouts.

**One GPU per rank** (``CudaHeap.create``): torch symmetric memory, one process (engine) per GPU.
``symm_mem.empty`` allocates this rank's arena so that peers can map it; ``rendezvous`` exchanges the
handles and gives every peer arena's address in this process (``buffer_ptrs``): exactly the heap bases
the device API needs. torch.distributed (NCCL) is initialised once per engine over a file store, and is
also what the benchmark's NCCL all-reduce baseline uses.

**Ranks sharing one GPU** (``CudaHeap.create_shared``): one process hosts every rank; each rank's arena
is a plain allocation on the same GPU, so the heap bases are simply their addresses. Each rank launches
on its own stream: kernels of different streams run at the same time, which the spin-waits between
ranks need (kernels of different *processes* on one GPU would take turns, and a waiting rank would hold
the GPU from the rank it waits for). The bytes between ranks then move through the GPU's own memory,
not NVLink: correct and concurrent, but no measure of multi-GPU speed.

**A process per rank on one GPU** (``CudaHeap.create_ipc``, for Iris programs: ``gemmar run``, which need
a process each): each rank's arena is a plain allocation on GPU 0, and the ranks map each other's through
CUDA IPC handles exchanged over a file store. Kernels of different processes take turns on the GPU
(time-slicing), so a wait for another rank lasts until the GPU switches to it: correct, and slow.
"""

import os

import torch

from ...errors import UsageError
from .base import SymmetricHeap, size_text


def store_path(folder):
    """The ranks' rendezvous file, in the cluster's private folder (not a name in /tmp others could take)."""
    return os.path.join(folder, "store")


def check_gpu_memory(device, nbytes, what):
    """Refuse, before allocating, what the GPU has no room for (an out-of-memory error deep inside
    symmetric memory or a kernel would say nothing about which setting to change)."""
    free, total = torch.cuda.mem_get_info(device)
    if nbytes > free:
        raise UsageError(f"{what} needs {size_text(nbytes)} of GPU memory; {device} has {size_text(free)} free of "
                         f"{size_text(total)}: use a smaller heap_size")


class CudaHeap(SymmetricHeap):
    backend = "cuda"

    @classmethod
    def create(cls, rank, world_size, size, folder, timeout_s=60.0):
        import datetime

        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        if not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
            raise UsageError(f"backend cuda needs {world_size} GPUs; this machine has {torch.cuda.device_count()}")
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        check_gpu_memory(device, size, f"heap_size={size}")
        if not dist.is_initialized():
            # The default group is the heap's (symmetric memory rendezvous on it); an Iris program run on these ranks
            # uses it too, for CPU tensors as well as GPU ones: gloo beside nccl.
            if "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
                os.environ["GLOO_SOCKET_IFNAME"] = "lo"   # (gloo's ranks talk over TCP: keep it on this machine)
            store = dist.FileStore(store_path(folder), world_size)
            dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=rank, world_size=world_size,
                                    device_id=device, timeout=datetime.timedelta(seconds=max(60, timeout_s)))
        group = dist.group.WORLD
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by torch < 2.9, harmless after
            symm_mem.enable_symm_mem_for_group(group.group_name)
        arena = symm_mem.empty(size, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(arena, group.group_name)
        bases = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
        arena.zero_()
        torch.cuda.synchronize(device)
        dist.barrier()
        heap = cls(rank, world_size, arena, bases, device, timeout_s)
        heap._handle = handle
        heap.barrier()
        return heap

    @classmethod
    def create_shared(cls, world_size, size, timeout_s=60.0, device=0):
        """Every rank's heap on one GPU, in this process: a list indexed by rank."""
        if not torch.cuda.is_available():
            raise UsageError("backend cuda needs a GPU; this machine has none")
        device = torch.device("cuda", device)
        torch.cuda.set_device(device)
        check_gpu_memory(device, size * world_size, f"heap_size={size} x {world_size} ranks sharing the GPU")
        arenas = [torch.zeros(size, dtype=torch.uint8, device=device) for _ in range(world_size)]
        bases = [a.data_ptr() for a in arenas]
        torch.cuda.synchronize(device)
        heaps = [cls(r, world_size, arena, torch.tensor(bases, dtype=torch.int64, device=device), device, timeout_s)
                 for r, arena in enumerate(arenas)]
        for heap in heaps:
            heap.ranks_on_device = world_size
        return heaps

    @classmethod
    def create_ipc(cls, rank, world_size, size, folder, timeout_s=60.0, device=0):
        """This rank's heap on GPU ``device``, shared with the ranks of the other processes there."""
        import datetime
        import pickle

        import torch.distributed as dist
        from torch.multiprocessing.reductions import reduce_tensor

        device = torch.device("cuda", device)
        torch.cuda.set_device(device)
        check_gpu_memory(device, size, f"heap_size={size}")
        arena = torch.zeros(size, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        store = dist.FileStore(store_path(folder) + ".ipc", world_size)
        store.set_timeout(datetime.timedelta(seconds=max(10.0, timeout_s)))
        store.set(f"arena{rank}", pickle.dumps(reduce_tensor(arena)))
        arenas = []
        for r in range(world_size):
            if r == rank:
                arenas.append(arena)
                continue
            rebuild, args = pickle.loads(store.get(f"arena{r}"))
            arenas.append(rebuild(*args))   # rank r's arena, mapped into this process
        bases = torch.tensor([a.data_ptr() for a in arenas], dtype=torch.int64, device=device)
        heap = cls(rank, world_size, arena, bases, device, timeout_s)
        heap._peer_arenas, heap._store = arenas, store   # (kept: the mappings live as long as the heap)
        heap.ranks_on_device = world_size
        heap.barrier()
        return heap

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stream = torch.cuda.Stream(self.device)
        self.side_stream = torch.cuda.Stream(self.device)
        self.side_done = torch.cuda.Event()

    def on_stream(self):
        return torch.cuda.stream(self.stream)

    def join_side_stream(self):
        self.side_done.record(self.side_stream)   # (one event, recorded again each launch: the wait takes
        self.stream.wait_event(self.side_done)    # the work recorded so far)

    def delay(self, seconds):
        from ...kernels.barrier import spin_kernel

        with self.on_stream():
            spin_kernel[(1,)](int(seconds * 1e9))

    def synchronize(self):
        # The whole device: setup work (zeroing buffers) runs on the default stream, launches on ours.
        torch.cuda.synchronize(self.device)
