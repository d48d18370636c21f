"""How an engine cluster notices a lost rank: engine processes that died (how: a signal, an exit code) or are
stopped, and the one-line RankDiedError that names the rank, how it ended and its last reported iteration.
A part of ``EngineCluster`` (``engines.py``), kept apart for its size."""

import psutil

from ..errors import RankDiedError
from .processes import _exit_text, _reaped_exit_code


class EngineDeaths:
    """Needs ``_engine_processes`` (psutil.Process per engine), ``pids`` (by rank) and ``engine_ranks``."""

    def _lost_engines(self):
        """{engine process index: (how, what)} for the engine processes that have ended ("died": 'engine
        process P was killed by SIGKILL' / '... exited with code 3') or are stopped ("froze"), in one pass."""
        lost = {}
        for i, proc in enumerate(self._engine_processes):
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
            lost[i] = ("died", f"engine process {proc.pid} {_exit_text(code)}")
        return lost

    def _dead_engines(self):
        return {i: what for i, (how, what) in self._lost_engines().items() if how == "died"}

    def _ranks_of_process(self, index):
        """The ranks engine process ``index`` hosts (known once the ranks have reported their pids)."""
        pid = self._engine_processes[index].pid
        return [r for r, p in enumerate(getattr(self, "pids", None) or []) if p == pid]

    def _raise_engine_failure(self, e, ar, seen):
        """Engine ``e``'s finished call: RankDiedError if its process died or was interrupted."""
        if ar.successful():
            return
        try:
            ar.get()
        except Exception as err:  # noqa: BLE001 - what it is decides below
            ename = getattr(err, "ename", type(err).__name__)   # ipyparallel wraps them in RemoteError
            if ename in ("EngineError", "KeyboardInterrupt"):
                dead = self._dead_engines() if ename == "EngineError" else {}
                if dead:   # how it ended, from its process
                    self._raise_rank_died(dead, seen, "died")
                ranks = self.engine_ranks[e]
                how = "was interrupted (SIGINT)" if ename == "KeyboardInterrupt" else "died"
                raise RankDiedError(f"rank {', '.join(map(str, ranks))} {how} during the run"
                                    f"{self._last_steps(ranks, seen)}", ranks) from None

    @staticmethod
    def _last_steps(ranks, seen):
        steps = [f"rank {r} last reported iteration {seen[r]['iteration']}" for r in ranks
                 if isinstance(seen.get(r), dict) and "iteration" in seen[r]]
        return f" ({'; '.join(steps)})" if steps else " (before it reported any iteration)"

    def _raise_rank_died(self, processes, seen, how):
        """An engine process is gone or frozen: say which rank, how and what it was doing, at once (the
        caller then stops every rank: the others may be spinning on flags it will never set)."""
        ranks = sorted(r for i in processes for r in self._ranks_of_process(i))
        which = f"rank {', '.join(map(str, ranks))}" if ranks else "an engine"
        raise RankDiedError(f"{which} {how} during the run: {'; '.join(processes.values())}"
                            f"{self._last_steps(ranks, seen) if ranks else ''}", ranks)
