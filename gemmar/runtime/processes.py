"""Process helpers for the engines: how a process ended, its session, its children, alive or not, killed."""

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


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(pid):
    try:
        proc = psutil.Process(pid)
        proc.kill()
        proc.wait(5)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass
