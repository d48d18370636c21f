"""Process helpers for the engines: how a process ended, its session, its children, alive or not, killed;
and keeping what a rank starts from outliving it (a subreaper, and ending a program's descendants)."""

import ctypes
import os
import signal
import time

import psutil


def _reaped_exit_code(proc, wait_s=1.0):
    """The exit code of an engine process that ipyparallel's launcher thread has reaped with this same
    psutil object, which keeps it (``wait()`` returns it; ``_exitcode`` tells whether it is there yet)."""
    deadline = time.monotonic() + wait_s
    while getattr(proc, "_exitcode", None) in (None, getattr(psutil, "_SENTINEL", object())):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return proc.wait(timeout=0)


def _exit_text(code):
    if code is None:
        return "is gone"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _session(pid):
    try:
        return os.getsid(pid) if pid is not None else None
    except OSError:
        return None


def _children(proc):
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _kill(pid, wait_s=5):
    try:
        proc = psutil.Process(pid)
        proc.kill()
        if wait_s:
            proc.wait(wait_s)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass


PR_SET_CHILD_SUBREAPER = 36   # <linux/prctl.h>


def become_subreaper():
    """Make this process (an engine) the subreaper of everything it starts: a descendant whose parent exits,
    even one that called setsid() to leave the engine's session, is re-parented here rather than to init,
    so it stays in this process's tree and can be ended with the program that started it. Linux only; a
    no-op elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def start_stamp(pid):
    """When process ``pid`` started, as a value that tells it apart from a later process given the same pid;
    None when it is gone. Not psutil's create_time(): that adds the boot time, which moves when the system
    clock is stepped (NTP, a VM's clock sync), so the same process can read a second apart, and an engine
    that compared them once took its living owner for dead and ended the cluster. On Linux: the start in
    clock ticks since boot (/proc/PID/stat, field 22), which never changes."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        pass
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def descendants():
    """This process's descendants now, as {pid: start_stamp} (pids are reused: the stamp tells them apart)."""
    found = {}
    for proc in _children(psutil.Process()):
        stamp = start_stamp(proc.pid)
        if stamp is not None:
            found[proc.pid] = stamp
    return found


def end_descendants_since(before):
    """SIGKILL every descendant of this process that is not in ``before`` (a ``descendants()`` taken when a
    program started): what the program started ends with it, whatever its session, signal mask or depth.
    Repeats until none is left (a process can fork while its siblings are killed). Returns how many ended."""
    ended = 0
    for _ in range(20):
        new = [pid for pid, born in descendants().items() if before.get(pid) != born]
        if not new:
            break
        for pid in new:
            _kill(pid, wait_s=0)
            ended += 1
        time.sleep(0.02)
    for proc in psutil.Process().children():   # reap our own zombies (re-parented ones too)
        if proc.pid not in before:
            try:
                proc.wait(0.5)
            except (psutil.Error, psutil.TimeoutExpired):
                pass
    return ended
