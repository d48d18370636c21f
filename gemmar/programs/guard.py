"""A program on a rank may not signal the processes above its rank: ``os.kill(os.getppid(), 9)`` killed
``gemmar run``'s client ("Killed", exit 137, and no line of gemmar's). While a program runs, ``os.kill`` and
``os.killpg`` refuse, with a PermissionError naming the process, a signal to the rank's ancestors (the engine's
launcher, the client, the shell above it), to their process groups, and to every process at once (pid -1).
What the program started itself, its own process and the other ranks can still be signalled. (A signal sent
another way, a ``kill`` command in a subprocess, is not stopped here.)
"""

import contextlib
import os
import signal


@contextlib.contextmanager
def ancestors_guarded(rank):
    import psutil

    try:
        ancestors = {p.pid: p.name() for p in psutil.Process().parents() if p.pid != 1}
    except psutil.Error:
        ancestors = {}
    own_group = os.getpgid(0)
    groups = {}
    for pid, name in ancestors.items():
        with contextlib.suppress(OSError):
            if os.getpgid(pid) != own_group:
                groups.setdefault(os.getpgid(pid), name)
    real_kill, real_killpg = os.kill, os.killpg

    def refused(call, target, whose):
        try:
            name = signal.Signals(call[1]).name
        except (ValueError, TypeError):
            name = str(call[1])
        return PermissionError(f"{call[0]}({target}, {name}) refused: {whose}, above rank {rank} (gemmar run's "
                               f"client, its launcher or the shell); a program on a rank signals only what it "
                               f"started")

    def kill(pid, sig):
        if sig and pid in ancestors:
            raise refused(("os.kill", sig), pid, f"pid {pid} is {ancestors[pid]!r}")
        if sig and pid < -1 and -pid in groups:
            raise refused(("os.kill", sig), pid, f"process group {-pid} is {groups[-pid]!r}'s")
        if sig and pid == -1:
            raise refused(("os.kill", sig), pid, "pid -1 is every process of this user, those")
        return real_kill(pid, sig)

    def killpg(pgid, sig):
        if sig and pgid in groups:
            raise refused(("os.killpg", sig), pgid, f"process group {pgid} is {groups[pgid]!r}'s")
        return real_killpg(pgid, sig)

    os.kill, os.killpg = kill, killpg
    try:
        yield
    finally:
        if os.kill is kill:
            os.kill = real_kill
        if os.killpg is killpg:
            os.killpg = real_killpg
