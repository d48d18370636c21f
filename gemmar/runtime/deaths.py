"""How an engine cluster notices a lost rank: engine processes that died (how: a signal, an exit code) or are
stopped, and the one-line RankDiedError that names the rank, how it ended and its last reported iteration.
``EngineCluster`` (``engines.py``) holds one :class:`DeathWatch` per start of its engines."""

import os
import signal
import sys
import time

import psutil

from ..errors import RankDiedError
from . import memory
from .processes import _exit_text, _reaped_exit_code
from .rank import OWNER_GONE_EXIT, progress_path


# A rank's process that touched memory it does not have: under the interpreter, a kernel's address that lands on
# no heap (a rank outside the world read from heap_bases, an offset past a buffer) reaches the real memory.
SIGSEGV_CAUSE = (" (on cpu ranks most often a kernel's address outside every heap: a rank outside the world, or an "
                 "offset past its buffer; run it with the sanitizer on, gemmar run --sanitize or sanitize=True, to "
                 "have the access named with its line)")


class DeathWatch:
    """The engine processes of one start of a cluster: ``processes`` (psutil.Process per engine, our children,
    so their exit codes can be read), ``engine_ranks`` (the ranks each hosts), and ``pids`` (each rank's
    process id, set once the ranks have reported them)."""

    def __init__(self, processes=(), engine_ranks=()):
        self.processes, self.engine_ranks, self.pids = list(processes), engine_ranks, None
        self.said_channel_failed = False   # (said once per start)
        self.oom_kills_before = memory.oom_kills() if self.processes else 0   # a SIGKILL then says if it was memory

    def lost(self):
        """{engine process index: (how, what)} for the engine processes that have ended ("died": 'engine
        process P was killed by SIGKILL' / '... exited with code 3') or are stopped ("froze"), in one pass."""
        lost = {}
        for i, proc in enumerate(self.processes):
            try:
                status = proc.status()
                if status == psutil.STATUS_STOPPED:
                    lost[i] = ("froze", f"engine process {proc.pid} is stopped (SIGSTOP or SIGTSTP): it cannot "
                                        f"answer")
                    continue
                if status != psutil.STATUS_ZOMBIE:
                    continue
                code = proc.wait(timeout=0)
            except psutil.NoSuchProcess:   # ipyparallel's launcher reaped it first, through this same object
                code = _reaped_exit_code(proc)
            except psutil.TimeoutExpired:
                continue
            lost[i] = ("died", f"engine process {proc.pid} {_exit_text(code)}{self._cause(code)}")
        return lost

    def _cause(self, code):
        """Words to add to how an engine process ended, where its exit code says more; else ''."""
        if code == -signal.SIGKILL:
            return memory.sigkill_cause(self.oom_kills_before)
        if code == -signal.SIGBUS:
            return memory.sigbus_cause()
        if code == -signal.SIGSEGV:
            return SIGSEGV_CAUSE
        if code == OWNER_GONE_EXIT:
            return ": it found the client that owns the cluster gone and ended every rank"
        return ""

    def dead(self):
        return {i: what for i, (how, what) in self.lost().items() if how == "died"}

    def ranks_of_process(self, index):
        """The ranks engine process ``index`` hosts (known once the ranks have reported their pids)."""
        pid = self.processes[index].pid
        return [r for r, p in enumerate(self.pids or []) if p == pid]

    def raise_engine_failure(self, e, ar, seen):
        """Engine ``e``'s finished call: RankDiedError if its process died or was interrupted."""
        if ar.successful():
            return
        try:
            ar.get()
        except Exception as err:  # noqa: BLE001 - what it is decides below
            ename = getattr(err, "ename", type(err).__name__)   # ipyparallel wraps them in RemoteError
            if ename in ("EngineError", "KeyboardInterrupt"):
                dead = self.dead() if ename == "EngineError" else {}
                if dead:   # how it ended, from its process
                    self.raise_rank_died(dead, seen, "died")
                ranks = self.engine_ranks[e]
                how = "was interrupted (SIGINT)" if ename == "KeyboardInterrupt" else "died"
                raise RankDiedError(f"rank {', '.join(map(str, ranks))} {how} during the run"
                                    f"{last_steps(ranks, seen)}", ranks) from None

    def raise_rank_died(self, processes, seen, how):
        """An engine process is gone or frozen: say which rank, how and what it was doing, at once (the
        caller then stops every rank: the others may be spinning on flags it will never set)."""
        ranks = sorted(r for i in processes for r in self.ranks_of_process(i))
        which = f"rank {', '.join(map(str, ranks))}" if ranks else "an engine"
        raise RankDiedError(f"{which} {how} during the run: {'; '.join(processes.values())}"
                            f"{last_steps(ranks, seen) if ranks else ''}", ranks)

    def check_launches_finish(self, late, heard, seen, launch_deadline_s, heap_folder):
        """RankDiedError for the engines in ``late`` that have reported no finished launch for
        ``launch_deadline_s`` (``heard``: when each last did, updated here for one whose progress file says it
        is busy; ``heap_folder``: where the progress files are)."""
        stuck = [e for e in late if time.monotonic() - heard[e] > launch_deadline_s]
        for e in [e for e in stuck if self._progress_age(e, heap_folder) < launch_deadline_s]:
            # The rank's launches finish, but nothing it publishes reaches this client: its channel
            # failed, not the rank. Say so once and go on (the run's own timeout still holds).
            if not self.said_channel_failed:
                print(f"[gemmar] rank {self.engine_ranks[e][0]} is finishing launches (its progress file "
                      f"says so), but its progress no longer reaches this client over ipyparallel's "
                      f"IOPub channel: the client's channel failed, not the rank; going on without "
                      f"progress reports", file=sys.stderr, flush=True)
                self.said_channel_failed = True
            heard[e] = time.monotonic()
            stuck.remove(e)
        if stuck:
            ranks = [r for e in stuck for r in self.engine_ranks[e]]
            raise RankDiedError(
                f"rank {', '.join(map(str, ranks))} finished no launch for {launch_deadline_s:g} s "
                f"(the client's deadline, 2 x timeout_s + 10 s: a launch that runs without waiting on "
                f"a flag, which the watchdog would catch){last_steps(ranks, seen)}; the ranks "
                f"were stopped", ranks)

    def _progress_age(self, e, heap_folder):
        """Seconds since engine ``e`` last reported progress, read from the file it touches (rank.progress_path),
        not from ipyparallel's channel; infinite when there is none."""
        try:
            return time.time() - os.stat(progress_path(heap_folder, self.engine_ranks[e][0])).st_mtime
        except OSError:
            return float("inf")


def last_steps(ranks, seen):
    """`` (rank r last reported iteration i; ...)`` from the progress ``seen`` (rank -> its last report)."""
    steps = [f"rank {r} last reported iteration {seen[r]['iteration']}" for r in ranks
             if isinstance(seen.get(r), dict) and "iteration" in seen[r]]
    return f" ({'; '.join(steps)})" if steps else " (before it reported any iteration)"
