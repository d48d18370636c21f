"""Iris programs on gemmar's ranks, from the client: ``Cluster.run_script`` (what ``gemmar run`` calls) and
``Cluster.activate`` (ipyparallel's ``%%px`` magics over the ranks). The rank side is ``rank.py``.

Like ``mpirun -np N python SCRIPT ARGS``: every rank runs the program at once, its output comes back line
by line tagged ``[rank r/N]``, and the run ends when every rank has. When a rank fails, the ranks still
running get ``FAILURE_GRACE_S`` to end on their own (they may be waiting for the failed one), then are
stopped; so are ranks still running at the deadline. A stopped or dead rank means fresh ranks next time.
"""

import contextlib
import os
import sys
import time
import uuid
from dataclasses import dataclass, field

from ..errors import UsageError
from . import rank as rank_scripts

FAILURE_GRACE_S = 5.0
DEADLINE_EXIT_CODE = 3


@dataclass
class ProgramResult:
    """How each rank's run of a program ended."""

    path: str
    exit_codes: list                           # by rank: 0 ok, else the rank's exit code (128 + signal if killed)
    errors: list                               # by rank: None, or one line saying how it failed
    stopped: list = field(default_factory=list)  # ranks stopped (deadline or another rank's failure)
    timed_out: bool = False
    sanitizer: object = None                   # sanitize=True: the SanitizerReport (races across ranks), if all ended

    @property
    def ok(self):
        return not any(self.exit_codes)

    @property
    def exit_code(self):
        """0 when every rank exited 0; 3 when a rank ran past the deadline; else the first failed rank's."""
        if self.timed_out:
            return DEADLINE_EXIT_CODE
        return next((c for c in self.exit_codes if c), 0)

    def failure_lines(self):
        return [f"rank {r}: {self.errors[r]}" for r in range(len(self.errors)) if self.errors[r]]


def _signal_exit_code(what):
    """'engine process 12 was killed by SIGSEGV' -> 139 (the shell's 128 + signal), else 1."""
    import signal

    for sig in signal.Signals:
        if what.endswith(f"killed by {sig.name}"):
            return 128 + sig.value
    return 1


class ProgramRunner:
    """A part of ``Cluster``: needs the engine cluster's client, engines, deaths and restart machinery."""

    def run_script(self, path, *args, timeout=None, echo=True, replace_iris=False, out=None, err=None,
                   sanitize=False):
        """Run the Python program ``path`` with ``args`` on every rank, as ``mpirun -np N python path args``
        would, with gemmar's ``iris`` module as ``iris``. Output is printed as it comes, each line tagged
        ``[rank r/N]`` (``echo=False``: not printed). ``timeout``: seconds before ranks still running are
        named and stopped (None: no deadline). ``sanitize`` (cpu): record every heap access of the program's
        kernels and report races and out-of-bounds accesses (``ProgramResult.sanitizer``, also printed).
        Returns a ProgramResult."""
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such program file")
        if sanitize and self.backend != "cpu":
            raise UsageError(f"sanitize=True is not allowed on the {self.backend} backend: the sanitizer watches "
                             f"kernels under the Triton interpreter, so use backend='cpu'")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 < timeout <= 86400):
            raise UsageError(f"timeout={timeout!r} is not allowed: use seconds from 0 to 86400, or None")
        if len(self.engine_ranks) != self.world_size:
            raise UsageError(f"Iris programs need one process per rank: this cluster's {self.world_size} ranks share "
                             f"one engine; start it with Cluster(..., process_per_rank=True)")
        out, err = out or sys.stdout, err or sys.stderr
        if not self.running and self.restart_reason:
            print(f"[gemmar] restarting the cluster: {self.restart_reason}", file=err, flush=True)
            self.start()
        W = self.world_size
        # Where this run's ranks meet for torch.distributed: a fresh file in the cluster's private folder.
        store_path = os.path.join(self.profile_dir, f"dist-{uuid.uuid4().hex}.store")
        pending = [self.client[eid].apply_async(rank_scripts.run_program, path, list(args), os.getcwd(), store_path,
                                                replace_iris, bool(sanitize)) for eid in self.engine_ids]
        records = [None] * W
        shown = [[0, 0] for _ in pending]   # per rank: stdout, stderr characters shown (whole lines only)
        exit_codes, errors, stopped = [None] * W, [None] * W, []
        deadline = None if timeout is None else time.monotonic() + timeout
        first_failure, timed_out = None, False

        def stream(final=False):
            for r, ar in enumerate(pending):
                for i, (text, to) in enumerate(((ar.stdout, out), (ar.stderr, err))):
                    text = text if isinstance(text, str) else "".join(text or [])
                    new = text[shown[r][i]:]
                    shown[r][i] = len(text)
                    lines = new.split("\n")
                    complete, rest = lines[:-1], lines[-1]
                    if final and rest:
                        complete, rest = complete + [rest], ""
                    for line in complete:
                        if echo:
                            print(f"[rank {r}/{W}] {line}", file=to, flush=True)
                    shown[r][i] -= len(rest)

        self._in_run = True
        try:
            while any(code is None for code in exit_codes):
                stream()
                for i, (how, what) in self._lost_engines().items():
                    for r in self._ranks_of_process(i) or [i]:
                        if exit_codes[r] is None:
                            exit_codes[r] = _signal_exit_code(what) if how == "died" else 1
                            errors[r] = what.replace("engine process", "its process")
                for r, ar in enumerate(pending):
                    if exit_codes[r] is None and ar.ready():
                        outcome = self._outcome(ar)
                        exit_codes[r], errors[r] = outcome["exit_code"], outcome["error"]
                        records[r] = outcome.get("sanitizer")
                failed = [r for r, c in enumerate(exit_codes) if c]
                if failed and first_failure is None:
                    first_failure = time.monotonic()
                running = [r for r, c in enumerate(exit_codes) if c is None]
                why = None
                if running and deadline is not None and time.monotonic() > deadline:
                    why, timed_out = f"still running after the {timeout:g} s deadline: stopped", True
                elif running and first_failure is not None and time.monotonic() - first_failure > FAILURE_GRACE_S:
                    why = f"stopped {FAILURE_GRACE_S:g} s after rank {failed[0]} failed"
                if why:
                    stream(final=True)
                    for r in running:
                        exit_codes[r], errors[r] = 1, why
                    stopped = running
                    break
                time.sleep(0.05)
            if not stopped:
                time.sleep(0.1)   # the last output of ranks that just ended
            stream(final=True)
        except KeyboardInterrupt:
            self._in_run = False
            self.stop()
            self._restart_reason = "its last program was interrupted and its ranks were stopped"
            raise
        finally:
            self._in_run = False
            with contextlib.suppress(OSError):
                os.remove(store_path)
        if stopped or any(e and e.startswith("its process") for e in errors):
            self.stop()   # a rank may spin forever on a flag: fresh ranks next time
            lost = stopped or [r for r, c in enumerate(exit_codes) if c]
            self._restart_reason = f"in its last program rank(s) {lost} were stopped or died"
        result = ProgramResult(path, exit_codes, errors, stopped, timed_out)
        if sanitize and all(records):
            from ..sanitizer import analyse

            result.sanitizer = analyse(records)
            if echo:
                print(f"[gemmar] {result.sanitizer}", file=out, flush=True)
        return result

    @staticmethod
    def _outcome(ar):
        try:
            return ar.get()
        except Exception as e:  # noqa: BLE001 - gemmar's own refusal (one line) or the engine's failure
            ename = getattr(e, "ename", type(e).__name__)
            evalue = getattr(e, "evalue", str(e))
            return {"exit_code": 1, "error": f"{ename}: {evalue}".splitlines()[0]}

    def activate(self, suffix=""):
        """Register ipyparallel's ``%px`` / ``%%px`` magics (``%%px{suffix}``) for these ranks in the running
        IPython, with gemmar's ``iris`` module importable on every rank: in a ``%%px`` cell ``import iris``
        and ``shmem = iris.iris(heap_size)`` work as in a program run by ``gemmar run``, kernels defined in
        the cell run on every rank, and each rank's output is shown under its engine. Returns the view."""
        if len(self.engine_ranks) != self.world_size:
            raise UsageError(f"%%px with Iris programs needs one process per rank: this cluster's {self.world_size} "
                             f"ranks share one engine; start it with Cluster(..., process_per_rank=True)")
        self.run(rank_scripts.install_iris, timeout=self.start_timeout_s)
        view = self.client[self.engine_ids]
        view.block = True
        view.activate(suffix)
        return view
