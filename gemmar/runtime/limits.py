"""What a cluster needs from the operating system besides memory, checked before anything starts: open files
(``ulimit -n``), processes and threads (``ulimit -u``), a writable temp folder with room for the private
ipyparallel profile, and (cpu ranks) a writable /dev/shm with inodes for the heap files.

Without these checks each limit shows up as a 25-36 line ipyparallel or OSError traceback, or as a start that
stalls for a minute. A soft limit below what is needed is raised to the hard limit where that is enough (any
process may do that); otherwise the start is refused in one line naming the limit, its value and the number
needed. The figures per rank are measured counts with room to spare (docs/decisions.md, "Limits").
"""

import os
import resource
import tempfile

import psutil

from ..errors import ClusterError
from .heap import size_text

FILES_BASE, FILES_PER_RANK = 64, 4       # open files of the busiest process (the controller) at W ranks
THREADS_BASE, THREADS_PER_RANK = 48, 16  # threads a cluster adds: controller, client, reaper; per engine
TEMP_BYTES, TEMP_INODES = 8 << 20, 64    # the private profile: connection files, logs, the store
HEAP_INODES_PER_RANK = 4                 # heap file, progress file, stores


def files_needed(world_size):
    return FILES_BASE + FILES_PER_RANK * world_size


def threads_needed(world_size):
    return THREADS_BASE + THREADS_PER_RANK * world_size


def _raise_soft(kind, need):
    """Raise the soft limit ``kind`` to at least ``need`` if the hard limit allows; return the soft limit now."""
    soft, hard = resource.getrlimit(kind)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard == resource.RLIM_INFINITY or hard >= need:
        try:
            resource.setrlimit(kind, (need, hard))   # (inherited by the processes the cluster starts)
            return need
        except (ValueError, OSError):
            pass
    return soft


def _threads_of_this_user():
    uid, count = os.getuid(), 0
    for proc in psutil.process_iter():
        try:
            if proc.uids().real == uid:
                count += proc.num_threads()
        except psutil.Error:
            continue
    return count


def _folder_room(folder, what, need_bytes, need_inodes, change):
    try:
        st = os.statvfs(folder)
    except OSError as e:
        raise ClusterError(f"{what} {folder} cannot be used ({e.strerror}): {change}") from None
    if not os.access(folder, os.W_OK | os.X_OK) or st.f_flag & os.ST_RDONLY:
        raise ClusterError(f"{what} {folder} is not writable{' (read-only)' if st.f_flag & os.ST_RDONLY else ''}: "
                           f"{change}")
    free, inodes = st.f_bavail * st.f_frsize, st.f_favail
    if free < need_bytes:
        raise ClusterError(f"{what} {folder} is full ({size_text(free)} free; the cluster needs about "
                           f"{size_text(need_bytes)} there): {change}")
    if st.f_files and inodes < need_inodes:   # (f_files 0: the file system keeps no inode count)
        raise ClusterError(f"{what} {folder} is out of inodes ({inodes} free; the cluster needs {need_inodes} "
                           f"files there): {change}")


def check_can_start(world_size, engines, backend, heap_folder_parent):
    """Refuse, in one line, a cluster of ``world_size`` ranks in ``engines`` processes that the process limits
    or the temp and heap folders cannot hold; raise soft limits that are too low where the hard ones allow."""
    need = files_needed(world_size)
    if _raise_soft(resource.RLIMIT_NOFILE, need) < need:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise ClusterError(f"the open-files limit (ulimit -n) is {soft}; a cluster of {world_size} ranks needs "
                           f"about {need}: raise it (ulimit -n {need}) or use fewer ranks")
    if os.geteuid() != 0:   # (root is not held to RLIMIT_NPROC)
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY:
            used, more = _threads_of_this_user(), threads_needed(engines)
            if _raise_soft(resource.RLIMIT_NPROC, used + more) < used + more:
                raise ClusterError(f"the process limit (ulimit -u) is {soft}; this user runs {used} processes and "
                                   f"threads and a cluster of {world_size} ranks needs about {more} more: raise it "
                                   f"(ulimit -u {used + more}) or use fewer ranks")
    temp = tempfile.gettempdir()
    _folder_room(temp, "the temp folder (TMPDIR)", TEMP_BYTES, TEMP_INODES,
                 "free space there, or point TMPDIR at another folder")
    if backend == "cpu":
        _folder_room(heap_folder_parent, "the heap folder", 0, HEAP_INODES_PER_RANK * world_size + 8,
                     "free space or inodes there, or make it writable (cpu ranks keep their heaps there)")


def start_failure(error, world_size):
    """A ClusterError of one line for an OS or ipyparallel failure while a cluster starts (the checks above
    could not foresee it: a limit hit by something else meanwhile), naming what ran out where it can tell."""
    import errno

    code = getattr(error, "errno", None)
    if code in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return ClusterError(f"too many open files while the cluster started (ulimit -n is {soft}; {world_size} "
                            f"ranks need about {files_needed(world_size)}): raise it or use fewer ranks")
    if code == errno.EAGAIN:
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        return ClusterError(f"no new process or thread could be made while the cluster started (ulimit -u is "
                            f"{soft}): raise it or use fewer ranks")
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        where = getattr(error, "filename", None) or tempfile.gettempdir()
        return ClusterError(f"the cluster could not write {where} ({error.strerror}): free space or inodes there, "
                            f"or point TMPDIR at another folder")
    first = (str(error).strip().splitlines() or [""])[0]
    if "Controller stopped" in first:
        first = first.split(" while waiting")[0]
        return ClusterError(f"ipyparallel's controller ended as the cluster started ({first}); the usual cause is "
                            f"a process limit: open files (ulimit -n, now "
                            f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}), processes (ulimit -u) or a full "
                            f"temp folder ({tempfile.gettempdir()})")
    return ClusterError(f"the cluster could not start: {type(error).__name__}: {first}")
