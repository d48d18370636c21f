"""The symmetric heap and its backends; ``create_heap`` is the one entry point the rank runtime uses."""

from ...errors import UsageError
from .base import ALIGN, DEFAULT_HEAP_BYTES, HEADER_BYTES, SymmetricHeap, barrier_all, size_text
from .cpu import make_heap_folder, remove_arenas, shm_dir


def create_heap(backend, rank, world_size, size, folder, timeout_s=60.0):
    """The one entry point the rank runtime uses; backends plug in here. ``folder``: the cluster's private
    folder (``make_heap_folder``) for heap files and rendezvous stores."""
    if backend == "cpu":
        from .cpu import CpuHeap

        return CpuHeap.create(rank, world_size, size, folder, timeout_s)
    if backend == "cuda":
        from .cuda import CudaHeap

        return CudaHeap.create(rank, world_size, size, folder, timeout_s)
    if backend == "iris":
        from .iris import IrisHeap

        return IrisHeap.create(rank, world_size, size, folder, timeout_s)
    raise UsageError(f"backend {backend!r} is not known: use cpu, cuda or iris")


__all__ = ["ALIGN", "DEFAULT_HEAP_BYTES", "HEADER_BYTES", "SymmetricHeap", "barrier_all", "create_heap",
           "make_heap_folder", "remove_arenas", "shm_dir", "size_text"]
