"""The cpu backend of the symmetric heap: a shared-memory file per rank, mapped by every rank's process.

Kernels run under the Triton interpreter, which does not copy CPU tensors: an address in a mapping is a
real address in this process, so translated pointers and atomics work across processes. Each file is
unlinked as soon as every rank has mapped it, so nothing is left in ``/dev/shm`` after the cluster stops,
or after a rank dies.

**Private to the cluster's owner.** The files live in a folder the client makes for the cluster
(:func:`make_heap_folder`: ``mkdtemp`` in /dev/shm, a random name, mode 0700), so another local user can
neither see their names, nor create a file there first, nor swap one in. Each rank still checks what it maps
(:func:`open_checked`: no symlink, a regular file of this user, no access for others, the heap's size) and
refuses anything else in one line, never mapping it.
"""

import contextlib
import mmap
import os
import secrets
import shutil
import stat
import tempfile
import time

import torch

from ...errors import ClusterError, UsageError
from ...kernels.triton_support import gemmar_interpreter
from ...sanitizer.record import BASES_GUARD
from .base import ALIGN, HEADER_BYTES, RANK_LEFT, SymmetricHeap


def shm_dir():
    """Where cpu arenas live: /dev/shm where it exists (Linux), else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def make_heap_folder(announce=None):
    """A new folder for one cluster's heap files and rendezvous stores, private to this user (0700).
    ``announce(path)`` is told each path before it is made (``private_folder``)."""
    return private_folder(shm_dir(), "gemmar-heaps-", announce)


def private_folder(parent, prefix, announce=None):
    """A new folder ``parent/prefix<random>``, 0700, as ``mkdtemp`` makes one, but ``announce(path)`` is told the
    path before it exists: a cluster's reaper then knows every folder it must remove, whenever its owner dies (a
    Ctrl-C between a ``mkdtemp`` and telling the reaper left an empty heap folder in /dev/shm for good)."""
    for _ in range(100):
        path = os.path.join(parent, prefix + secrets.token_hex(6))
        if announce is not None:
            announce(path)
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent}: no free name for a new {prefix}* folder after 100 tries")


def check_private_folder(folder, rank):
    """``folder`` is a real folder of this user that no one else can enter (or a ClusterError, one line)."""
    try:
        st = os.lstat(folder)
    except OSError as e:
        raise ClusterError(f"rank {rank}: the cluster's heap folder {folder} is not there ({e.strerror})") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ClusterError(f"rank {rank}: {folder} is not this cluster's private heap folder (owner uid "
                           f"{st.st_uid}, mode {stat.filemode(st.st_mode)}): refused")


def open_checked(path, size, rank, owner_rank):
    """Open rank ``owner_rank``'s heap file for mapping, or refuse it in one line: a symlink, anything but a
    regular file, a file of another user, one others may read or write, or one of the wrong size."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    problem = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
               f"owned by uid {st.st_uid}, not {os.geteuid()}" if st.st_uid != os.geteuid() else
               f"mode {stat.filemode(st.st_mode)}: others may use it" if st.st_mode & 0o077 else
               f"{st.st_size} bytes, not {size}" if st.st_size != size else None)
    if problem:
        os.close(fd)
        raise ClusterError(f"rank {rank}: {path} is not rank {owner_rank}'s heap ({problem}): refused, not mapped")
    return fd


def remove_arenas(folder):
    """Remove a cluster's heap folder and what is in it (files a rank that died left behind). Only what
    this user owns is removed; anything else is skipped, never an error, so cleanup always ends."""
    removed = []
    if not folder or not os.path.isdir(folder) or os.path.islink(folder):
        return removed
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == os.geteuid():
                os.unlink(path)
                removed.append(name)
    with contextlib.suppress(OSError):
        if os.lstat(folder).st_uid == os.geteuid():
            shutil.rmtree(folder, ignore_errors=True)
    return removed


class CpuHeap(SymmetricHeap):
    """Arenas in shared-memory files, mapped by every rank's process. Kernels run under the interpreter."""

    backend = "cpu"

    def on_stream(self):
        """Kernels launched inside run on gemmar's interpreter: Triton's, with the patches of
        kernels/triton_support.py, applied only inside this scope."""
        return gemmar_interpreter()

    @classmethod
    def create(cls, rank, world_size, size, folder, timeout_s=60.0):
        if size < HEADER_BYTES + ALIGN:
            raise UsageError(f"heap_size={size} is too small: use at least {HEADER_BYTES + ALIGN} bytes")
        check_private_folder(folder, rank)
        paths = [os.path.join(folder, f"rank{r}") for r in range(world_size)]
        # Create under a temporary name and rename: a peer never maps a file that is not full size yet.
        tmp = paths[rank] + ".tmp"
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise ClusterError(f"rank {rank} could not make its heap file {tmp}: {e.strerror}") from None
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
                    fd = open_checked(path, size, rank, r)
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        raise ClusterError(f"rank {rank}: rank {r}'s heap did not appear within {timeout_s:g} s "
                                           f"({path})") from None
                    time.sleep(0.01)
                except OSError as e:   # ELOOP: a symlink in its place
                    raise ClusterError(f"rank {rank}: {path} is not rank {r}'s heap ({e.strerror}): refused, not "
                                       f"mapped") from None
            try:
                maps.append(mmap.mmap(fd, size))
            except OSError as e:
                raise ClusterError(f"rank {rank} could not map rank {r}'s {size}-byte heap: {e.strerror}") from None
            finally:
                os.close(fd)
        arenas = [torch.frombuffer(m, dtype=torch.uint8) for m in maps]
        # The table sits inside a zeroed guard on each side that nothing else uses: the sanitizer tells a read of
        # heap_bases[rank] for a rank outside the world by its address falling there (sanitizer/record.py).
        guarded = torch.zeros(2 * BASES_GUARD + world_size, dtype=torch.int64)
        bases = guarded[BASES_GUARD:BASES_GUARD + world_size]
        bases.copy_(torch.tensor([a.data_ptr() for a in arenas], dtype=torch.int64))
        heap = cls(rank, world_size, arenas[rank], bases, torch.device("cpu"), timeout_s)
        heap._peer_arenas = arenas   # keeps every mapping alive as long as the heap
        heap.folder = os.path.dirname(paths[rank])   # private to this user: the sanitizer's lock lives here too
        try:
            heap.barrier()          # every rank has mapped every arena ...
        finally:
            os.unlink(paths[rank])  # ... so the name can go; the memory lives while it is mapped
        return heap

    def give_up_barrier(self, why):
        self._rank_left = why
        self._barrier_watchdog[0] = RANK_LEFT   # (shared memory: the interpreted wait's next poll sees it)

    def _barrier_count(self):
        return int(self._peer_arenas[0][:8].view(torch.int64)[0])

    def close(self):
        super().close()
        self._peer_arenas = None  # the mappings close when the last tensor view of them is gone
