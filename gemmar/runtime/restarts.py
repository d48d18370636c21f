"""Ranks started again after a run stopped them (a rank died, froze, or hung in a launch): the next call starts
fresh ones and says why; in interactive use (a notebook, IPython) they start at once, in the background, so that
the next call (a puzzle's check after a hang) finds them up rather than waiting for a whole start (issue 61).
A mix-in of :class:`~gemmar.runtime.engines.EngineCluster`, which holds the state it reads."""

import sys
import threading

from ..errors import ClusterError


def interactive():
    """Whether this process is an IPython shell or a Jupyter kernel (someone waits at the next cell)."""
    shell = sys.modules.get("IPython")
    return shell is not None and getattr(shell, "get_ipython", lambda: None)() is not None


class RestartsEarly:
    def ensure_running(self):
        """Before a call on the ranks: start fresh ones if the last call stopped them (saying why)."""
        if threading.current_thread() is self._early_start:
            return   # (the start in the background, calling its ranks)
        self._wait_for_early_start()
        if self._restart_reason and self.running:   # (started again in the background, after the last call)
            print(f"[gemmar] restarted the cluster: {self._restart_reason}", file=sys.stderr, flush=True)
            self._restart_reason = None
        if not self.running and self._restart_reason:
            print(f"[gemmar] restarting the cluster: {self._restart_reason}", file=sys.stderr, flush=True)
            self.start()
        if not self.running:
            raise ClusterError("the cluster is not running: call start() (or restart()) first")

    def stop_for_restart(self, reason, early=True):
        """Stop every rank now (one may spin forever on a flag); the next call starts fresh ones, saying
        ``reason``. With ``restart_early`` (interactive use) and ``early``, the fresh ones start now, in the
        background: a puzzle's check after a hang found no ranks and waited for a whole start (issue 61)."""
        self._in_run = False
        self.stop()
        self._restart_reason = reason
        if self.restart_early and early:
            self._early_start = threading.Thread(target=self._start_early, daemon=True, name="gemmar-restart")
            self._early_start.start()

    def _start_early(self):
        try:
            with self._stop_lock:   # (a stop() meanwhile waits for this start, then ends what it started)
                if self._restart_reason is not None and self.client is None:
                    self.start()
        except BaseException:   # noqa: BLE001 - the next call starts the ranks itself, and says what fails
            pass

    def _wait_for_early_start(self):
        early = getattr(self, "_early_start", None)
        if early is not None and early is not threading.current_thread():
            early.join()
