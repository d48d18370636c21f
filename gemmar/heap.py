"""The symmetric heap: one arena per rank, the same allocations at the same offsets on every rank.

Each rank's process sees every rank's arena at some address; ``heap_bases[q]`` is where rank ``q``'s
arena starts *in this process*. The device API turns an address in our arena into the same offset in a
peer's arena with those bases. Allocation is a bump pointer that every rank moves the same way (all ranks
make the same calls in the same order), so a buffer has the same offset everywhere.

Backends differ only in how arenas are made and mapped:

- ``cpu``: a shared-memory file per rank (``/dev/shm``), mapped by every rank's process; kernels run
  under the Triton interpreter. Each file is unlinked as soon as every rank has mapped it, so nothing is
  left in ``/dev/shm`` after the cluster stops, or after a rank dies.
- ``cuda``: torch symmetric memory (``symm_mem.empty`` + ``rendezvous``) gives the peers' pointers.
- ``iris``: real Iris on ROCm, which hands over its own heap bases.
"""

import contextlib
import mmap
import os
import tempfile
import time

import torch

from .errors import ClusterError, DeadlockError, UsageError
from .events import FLAG_NAMES

ALIGN = 256
HEADER_BYTES = 256         # barrier counter + barrier watchdog at the start of every arena
DEFAULT_HEAP_BYTES = 256 << 20


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


def deadlock_message(waits):
    parts = []
    for w in waits:
        where = "at the barrier" if w["flag"] == "barrier" else f"on tile {w['tile']}"
        parts.append(f"rank {w['rank']} (program {w['program']}) waited {where} for flag "
                     f"{w['flag']}[{w['index']}] >= {w['expected']} but saw {w['seen']}")
    return "deadlock: " + "; ".join(parts)


def read_watchdog(words):
    """A watchdog record (8 int64s) -> dict, or None when nothing expired."""
    words = [int(x) for x in words]
    if words[0] == 0:
        return None
    return dict(rank=words[1], tile=words[2], flag=FLAG_NAMES.get(words[3], str(words[3])), index=words[4],
                expected=words[5], seen=words[6], program=words[7])


class SymmetricHeap:
    """Bookkeeping shared by all backends: allocation, the barrier, the bases."""

    backend = "?"

    def __init__(self, rank, world_size, arena, heap_bases, device, timeout_s):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.arena = arena                   # this rank's arena: a uint8 tensor on `device`
        self.heap_bases = heap_bases         # int64 tensor on `device`: every arena, as this process sees it
        self.size = arena.numel()
        self.timeout_s = timeout_s
        misaligned = [b for b in heap_bases.tolist() if b % ALIGN]
        if misaligned:  # device.translate relies on heaps starting on ALIGN-byte boundaries
            raise ClusterError(f"rank {rank}: heap bases {misaligned} are not {ALIGN}-byte aligned")
        self._top = HEADER_BYTES
        self._barriers = 0
        words = self.arena[:HEADER_BYTES].view(torch.int64)
        self._barrier_counter = words[0:1]
        self._barrier_watchdog = words[8:16]
        self._barrier_exit = words[16:17]

    # -- allocation -----------------------------------------------------------------------------------
    def _alloc(self, nbytes):
        offset = -(-self._top // ALIGN) * ALIGN
        if offset + nbytes > self.size:
            raise UsageError(f"heap too small: this run needs {offset + nbytes} bytes of symmetric heap per rank, "
                             f"the heap has {self.size}; start the Cluster with a larger heap_size")
        self._top = offset + nbytes
        return offset

    def empty(self, shape, dtype):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for s in shape:
            count *= s
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        offset = self._alloc(nbytes)
        return self.arena[offset:offset + nbytes].view(dtype).view(shape)

    def zeros(self, shape, dtype):
        return self.empty(shape, dtype).zero_()

    def full(self, shape, value, dtype):
        return self.empty(shape, dtype).fill_(value)

    @contextlib.contextmanager
    def scope(self):
        """Allocations made inside are released on exit (on every rank alike: keep the calls symmetric)."""
        top = self._top
        try:
            yield self
        finally:
            self._top = top

    def offset_of(self, tensor):
        return tensor.data_ptr() - self.arena.data_ptr()

    # -- synchronisation ------------------------------------------------------------------------------
    def synchronize(self):
        """Wait for this rank's device work (no-op on cpu)."""

    def barrier(self, timeout_s=None, wait=True):
        """All ranks meet here; returns ``now()`` (device clock, ns) as this rank left.

        A rank that never arrives raises DeadlockError after ``timeout_s``. With ``wait=False`` (GPU
        timing loops) the barrier is only enqueued behind this rank's work: no host synchronisation, no
        return value; call :meth:`check_barrier` once afterwards.
        """
        from .kernels.barrier import barrier_kernel

        if wait:
            self.synchronize()
        self._barriers += 1
        timeout_ns = int((timeout_s or self.timeout_s) * 1e9)
        barrier_kernel[(1,)](self._barrier_counter, self._barrier_watchdog, self._barrier_exit, self.heap_bases,
                             self.rank, self._barriers * self.world_size, timeout_ns)
        if wait:
            self.synchronize()
            self.check_barrier()
            return int(self._barrier_exit.item())

    def check_barrier(self):
        self.raise_if_expired(self._barrier_watchdog)

    def raise_if_expired(self, watchdog):
        report = read_watchdog(watchdog.tolist())
        if report is not None:
            watchdog.zero_()
            raise DeadlockError(deadlock_message([report]), [report])

    def close(self):
        self.arena = None
        self.heap_bases = None


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
        finally:
            os.close(fd)
        os.rename(tmp, paths[rank])

        maps, deadline = [], time.monotonic() + timeout_s
        for r, path in enumerate(paths):
            while True:
                try:
                    fd = os.open(path, os.O_RDWR)
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        os.unlink(paths[rank])
                        raise ClusterError(f"rank {rank}: rank {r}'s heap did not appear within {timeout_s:g} s "
                                           f"({path})") from None
                    time.sleep(0.01)
            try:
                maps.append(mmap.mmap(fd, size))
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


def create_heap(backend, rank, world_size, size, cluster_id, timeout_s=60.0):
    """The one entry point the rank runtime uses; backends plug in here."""
    if backend == "cpu":
        return CpuHeap.create(rank, world_size, size, cluster_id, timeout_s)
    if backend == "cuda":
        from .heap_cuda import CudaHeap

        return CudaHeap.create(rank, world_size, size, cluster_id, timeout_s)
    if backend == "iris":
        from .heap_iris import IrisHeap

        return IrisHeap.create(rank, world_size, size, cluster_id, timeout_s)
    raise UsageError(f"backend {backend!r} is not known: use cpu, cuda or iris")
