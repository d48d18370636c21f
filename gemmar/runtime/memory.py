"""How much memory a run may really use: the tightest of the machine's available memory and the memory
limits of the cgroups this process is in (a container's, a batch job's, a systemd slice's), and what to call
a rank killed by SIGKILL when one of those limits was hit.

In a container ``psutil.virtual_memory()`` shows the host's memory: a run sized by it is OOM-killed at the
container's limit, and all the user sees is "killed by SIGKILL". So every check asks ``available()``, which
also reads cgroup v2 (``memory.max``, ``memory.current``) and v1 (``memory.limit_in_bytes``,
``memory.usage_in_bytes``) along the path to the root (a parent's limit binds its children too).
"""

import os

import psutil

from .heap import size_text

# An idle cpu engine (Python, torch, Triton, ipyparallel) is about this much resident memory of its own; a
# cluster needs it per rank before any problem is allocated (measured: docs/decisions.md, "Memory").
ENGINE_BYTES = 300 << 20
NO_LIMIT = 1 << 60   # cgroup v1 writes "no limit" as a number near 2**63


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _number(text):
    return int(text) if text and text.isdigit() else None


def _reclaimable(stat_text, key):
    """Page cache the kernel drops before it OOM-kills: counted as free, as the host's 'available' does."""
    for line in (stat_text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.isdigit():
            return int(value)
    return 0


def _mounts():
    """{controller: (mount point, mount root)} for the memory controller (v1) and the unified hierarchy (v2)."""
    found = {}
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        head, _, tail = line.partition(" - ")
        fields, kind = head.split(), tail.split()
        if len(fields) < 5 or len(kind) < 3:
            continue
        if kind[0] == "cgroup2":
            found.setdefault("v2", (fields[4], fields[3]))
        elif kind[0] == "cgroup" and "memory" in kind[2].split(","):
            found.setdefault("v1", (fields[4], fields[3]))
    return found


def cgroup_limits():
    """[(free bytes, limit bytes, folder)] for every cgroup memory limit on this process's path, tightest
    first; empty when none is set (or cgroups cannot be read)."""
    mounts, limits = _mounts(), []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        version = "v2" if hierarchy == "0" and controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version not in mounts:
            continue
        mount, root = mounts[version]
        if root != "/" and path.startswith(root):   # (a container that sees its own cgroup as the root)
            path = path[len(root):] or "/"
        folder = os.path.normpath(mount + "/" + path.lstrip("/"))
        while folder.startswith(mount):
            if version == "v2":
                limit, used = _number(_read(f"{folder}/memory.max")), _number(_read(f"{folder}/memory.current"))
                cache = _reclaimable(_read(f"{folder}/memory.stat"), "inactive_file")
            else:
                limit, used = _number(_read(f"{folder}/memory.limit_in_bytes")), _number(
                    _read(f"{folder}/memory.usage_in_bytes"))
                cache = _reclaimable(_read(f"{folder}/memory.stat"), "total_inactive_file")
            if limit is not None and used is not None and limit < NO_LIMIT:
                limits.append((max(0, limit - used + cache), limit, folder))
            if folder == mount:
                break
            folder = os.path.dirname(folder)
    return sorted(limits)


def available():
    """(bytes a run may still use, the words that say where that figure comes from)."""
    host = psutil.virtual_memory().available
    limits = cgroup_limits()
    if limits and limits[0][0] < host:
        free, limit, folder = limits[0]
        return free, f"this container's memory limit is {size_text(limit)} ({size_text(free)} of it free; cgroup {folder})"
    return host, f"this machine has {size_text(host)} available"


def check_fits(need, what, change):
    """Refuse, in one line, ``what`` (it needs ``need`` bytes) when it cannot fit; ``change``: what to do."""
    from ..errors import UsageError

    free, where = available()
    if need > free:
        raise UsageError(f"{what} needs about {size_text(need)} of memory; {where}: {change}")


def oom_kills():
    """How many processes the kernel has OOM-killed in this process's cgroups so far (v1 ``oom_kill`` in
    ``memory.oom_control``, v2 ``oom_kill`` in ``memory.events``), plus the host's count from /proc/vmstat."""
    total = _reclaimable(_read("/proc/vmstat"), "oom_kill")
    for _free, _limit, folder in cgroup_limits():
        for name in ("memory.events", "memory.oom_control"):
            total += _reclaimable(_read(f"{folder}/{name}"), "oom_kill")
    return total


def sigkill_cause(kills_before):
    """Words to add to 'was killed by SIGKILL' when the OOM killer struck since ``kills_before`` (an
    ``oom_kills()`` count), or when memory is nearly all used now; else ''."""
    free, where = available()
    if oom_kills() > kills_before:
        return f" (out of memory: the kernel's OOM killer ended it; {where})"
    if free < (256 << 20):
        return f" (most likely out of memory: {where})"
    return ""


def sigbus_cause():
    """Words to add to 'was killed by SIGBUS' when /dev/shm (where cpu heaps live) is full now: a heap's pages
    are taken from it as they are first touched, so a /dev/shm that fills after the start-up check (another
    program, or this one writing there) ends a rank with SIGBUS at its next new page; else ''."""
    from .heap import shm_dir

    try:
        stats = os.statvfs(shm_dir())
    except OSError:
        return ""
    free, total = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    if total and free < max(16 << 20, total // 100):
        return (f" ({shm_dir()} is full: {size_text(free)} free of {size_text(total)}, and a heap takes its memory "
                f"from there page by page as it is first used: free space there, or use a smaller heap)")
    return ""
