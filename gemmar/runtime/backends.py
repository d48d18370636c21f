"""Where ranks run: the backend (cpu, cuda, iris), the GPUs there are, and whether ranks share one; and the
checks on world size and heap size that come before any engine starts."""

import shutil

import torch

from ..config import BACKENDS, MAX_WORLD_SIZE
from ..errors import UsageError
from .heap import ALIGN, HEADER_BYTES, shm_dir, size_text


def gpu_properties(backend):
    """(name, compute capability, multiprocessors) of GPU 0 as the client sees it; blanks off the GPU."""
    if backend != "cuda":
        return "", (0, 0), 0
    props = torch.cuda.get_device_properties(0)
    return props.name, (props.major, props.minor), props.multi_processor_count


def gpu_count():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def shares_gpu(backend, world_size):
    """True when the ranks share GPU 0 (cuda with more ranks than GPUs): one engine then hosts them all."""
    return backend == "cuda" and world_size > gpu_count()


def resolve_backend(backend, world_size):
    """'auto' -> cuda on an NVIDIA GPU (ranks share it when there are more ranks than GPUs), else cpu.
    Checks that the choice can run here."""
    if backend not in BACKENDS:
        raise UsageError(f"backend {backend!r} is not known: use one of {', '.join(BACKENDS)}")
    gpus = gpu_count()
    if backend == "auto":
        backend = "cuda" if gpus >= 1 and torch.version.hip is None else "cpu"
    if backend == "cuda" and gpus == 0:
        raise UsageError("backend 'cuda' needs an NVIDIA GPU; this machine has none: use backend='cpu'")
    if backend == "iris":
        try:
            import iris  # noqa: F401
        except ImportError:
            raise UsageError("backend 'iris' needs Iris installed (import iris failed): use cpu or cuda") from None
    return backend


def check_world_size(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise UsageError(f"world_size={world_size!r} is not allowed: use a whole number from 1 to {MAX_WORLD_SIZE}")


def check_heap_fits(backend, world_size, heap_size):
    """Before anything is allocated: a heap too small to hold anything, or (cpu) arenas that /dev/shm could
    not hold all at once (they are sparse files: a write past the free space kills the rank with SIGBUS)."""
    smallest = HEADER_BYTES + ALIGN
    if isinstance(heap_size, bool) or not isinstance(heap_size, int) or heap_size < smallest:
        raise UsageError(f"heap_size={heap_size!r} is not allowed: use whole bytes per rank, at least {smallest}")
    if backend == "cpu":
        free = shutil.disk_usage(shm_dir()).free
        if heap_size * world_size > free:
            raise UsageError(f"heap_size={heap_size} ({size_text(heap_size)}) x {world_size} ranks needs "
                             f"{size_text(heap_size * world_size)} of shared memory; {shm_dir()} has "
                             f"{size_text(free)} free: use a smaller heap_size")
