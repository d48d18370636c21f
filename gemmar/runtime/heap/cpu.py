"""The cpu backend of the symmetric heap: a shared-memory file per rank, mapped by every rank's process.

Kernels run under the Triton interpreter, which does not copy CPU tensors: an address in a mapping is a
real address in this process, so translated pointers and atomics work across processes. Each file is
unlinked as soon as every rank has mapped it, so nothing is left in ``/dev/shm`` after the cluster stops,
or after a rank dies.
"""

import contextlib
import mmap
import os
import tempfile
import time

import torch

from ...errors import ClusterError, UsageError
from .base import ALIGN, HEADER_BYTES, SymmetricHeap


def shm_dir():
    """Where cpu arenas live: /dev/shm where it exists (Linux), else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def arena_prefix(cluster_id):
    return f"gemmar-{cluster_id}-rank"


def remove_arenas(cluster_id):
    """Unlink any arena files of this cluster still on disk (after a rank died before unlinking its own)."""
    prefix = arena_prefix(cluster_id)
    removed = []
    for name in os.listdir(shm_dir()):
        if name.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(shm_dir(), name))
                removed.append(name)
    return removed


class CpuHeap(SymmetricHeap):
    """Arenas in shared-memory files, mapped by every rank's process. Kernels run under the interpreter."""

    backend = "cpu"

    @classmethod
    def create(cls, rank, world_size, size, cluster_id, timeout_s=60.0):
        if size < HEADER_BYTES + ALIGN:
            raise UsageError(f"heap_size={size} is too small: use at least {HEADER_BYTES + ALIGN} bytes")
        folder, prefix = shm_dir(), arena_prefix(cluster_id)
        paths = [os.path.join(folder, f"{prefix}{r}") for r in range(world_size)]
        # Create under a temporary name and rename: a peer never maps a file that is not full size yet.
        tmp = paths[rank] + ".tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            os.rename(tmp, paths[rank])
        except OSError as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise ClusterError(f"rank {rank} could not make its {size}-byte heap in {folder}: {e.strerror}") from None
        finally:
            os.close(fd)
        try:
            return cls._map_all(rank, world_size, size, paths, timeout_s)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths[rank])   # nothing left in /dev/shm by a rank that failed to start
            raise

    @classmethod
    def _map_all(cls, rank, world_size, size, paths, timeout_s):

        maps, deadline = [], time.monotonic() + timeout_s
        for r, path in enumerate(paths):
            while True:
                try:
                    fd = os.open(path, os.O_RDWR)
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        raise ClusterError(f"rank {rank}: rank {r}'s heap did not appear within {timeout_s:g} s "
                                           f"({path})") from None
                    time.sleep(0.01)
            try:
                maps.append(mmap.mmap(fd, size))
            except OSError as e:
                raise ClusterError(f"rank {rank} could not map rank {r}'s {size}-byte heap: {e.strerror}") from None
            finally:
                os.close(fd)
        arenas = [torch.frombuffer(m, dtype=torch.uint8) for m in maps]
        bases = torch.tensor([a.data_ptr() for a in arenas], dtype=torch.int64)
        heap = cls(rank, world_size, arenas[rank], bases, torch.device("cpu"), timeout_s)
        heap._peer_arenas = arenas   # keeps every mapping alive as long as the heap
        try:
            heap.barrier()          # every rank has mapped every arena ...
        finally:
            os.unlink(paths[rank])  # ... so the name can go; the memory lives while it is mapped
        return heap

    def close(self):
        super().close()
        self._peer_arenas = None  # the mappings close when the last tensor view of them is gone
