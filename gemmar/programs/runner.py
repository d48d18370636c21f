"""Programs on gemmar's ranks, from the client: ``Cluster.run_script`` (what ``gemmar run`` calls) and
``Cluster.activate`` (ipyparallel's ``%%px`` magics over the ranks). The rank side is ``rank.py``; what a layer
sets up on each rank first (gemmar's Iris layer: ``import iris``) comes through ``hooks.py``.

Like ``mpirun -np N python SCRIPT ARGS``: every rank runs the program at once, its output comes back line
by line tagged ``[rank r/N]``, and the run ends when every rank has. When a rank fails, the ranks still
running get ``FAILURE_GRACE_S`` to end on their own (they may be waiting for the failed one), then are
stopped; so are ranks still running at the deadline. A rank that ends with a non-zero exit code of its own (``sys.exit(1)``,
pytest after a failed test) has not failed that way: the others run on to their own end. A stopped or dead rank means fresh ranks next time.
The ranks still running are told which ranks have ended, however they ended (``departures.py``): a barrier that
waits for one of them can no longer complete, and ends at once in one line (:meth:`ProgramResult.failure_lines`).
"""

import contextlib
import os
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field

from ..errors import UsageError
from . import departures, hooks
from . import rank as rank_scripts
from . import whereabouts
from .host_calls import is_program_file

FAILURE_GRACE_S = 5.0
# How long a rank's call that came back as its engine's death waits for the engine's process to be seen gone (its
# exit then says how: a signal, an exit code), before the rank is reported with ipyparallel's words alone.
ENGINE_EXIT_WAIT_S = 3.0
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
    ended_at: list = field(default_factory=list)  # by rank: when it ended (time.time()), to tell which failed first

    @property
    def ok(self):
        return not any(self.exit_codes)

    @property
    def exit_code(self):
        """0 when every rank exited 0; 3 when a rank ran past the deadline; else the exit code of the rank that
        failed first in time (not the lowest-numbered: the others may have failed because of it)."""
        if self.timed_out:
            return DEADLINE_EXIT_CODE
        failed = [r for r, c in enumerate(self.exit_codes) if c]
        if not failed:
            return 0
        ended = self.ended_at if len(self.ended_at) == len(self.exit_codes) else [0.0] * len(self.exit_codes)
        return self.exit_codes[min(failed, key=lambda r: (ended[r] or float("inf"), r))]

    def failure_lines(self):
        """'rank 2: ValueError: ...' for each rank that failed; the ranks whose barrier gave up because a rank had
        ended, in one line with that rank: 'rank 1 ended (exit code 0) before the barrier at prog.py:12; ranks
        0, 2 were waiting there' (the rank's own line goes when it only says its exit code)."""
        waits = {}   # (who ended and how, the barrier, where) -> the ranks that waited there
        for r, error in enumerate(self.errors):
            found = LEFT_WAIT.fullmatch(error or "")
            if found:
                waits.setdefault(found.groups(), []).append(r)
        left = {int(who.split()[1]) for who, _, _ in waits}
        lines = []
        for r, error in enumerate(self.errors):
            found = LEFT_WAIT.fullmatch(error or "")
            if found and found.groups() in waits:
                who, barrier, where = found.groups()
                ranks = waits.pop(found.groups())
                lines.append(f"{who} before the {barrier}{f' at {where}' if where else ''}; "
                             f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))} "
                             f"{'was' if len(ranks) == 1 else 'were'} waiting there")
            elif error and not found and not (r in left and ONLY_EXIT_CODE.fullmatch(error)):
                lines.append(f"rank {r}: {error}")
        return lines


# A rank's line when its barrier gave up because a rank had ended (departures.py; rank.failure_line adds where).
LEFT_WAIT = re.compile(r"RankLeftError: (rank \d+ ended \(.+?\)) before the (\S+)(?: \((\S+:\d+)\))?")
ONLY_EXIT_CODE = re.compile(r"exit code -?\d+|its process \d+ exited with code \d+")


def _signal_exit_code(what):
    """'engine process 12 was killed by SIGSEGV' -> 139 (the shell's 128 + signal); '... exited with code 3'
    (a program's os._exit(3)) -> 3; else 1."""
    found = re.search(r"killed by (SIG[A-Z0-9]+)\b", what)   # (what may go on: "... (out of memory: ...)")
    if found and found.group(1) in signal.Signals.__members__:
        return 128 + signal.Signals[found.group(1)].value
    found = re.search(r"exited with code (\d+)\b", what)
    return int(found.group(1)) or 1 if found else 1


def run_script(cluster, path, args=(), timeout=None, echo=True, out=None, err=None, sanitize=False, **hook_options):
    """``Cluster.run_script`` (its docstring says what each argument does): the program at ``path`` on every
    rank of ``cluster``, an EngineCluster with one process per rank. Returns a ProgramResult."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such program file")
    if sanitize and cluster.backend != "cpu":
        raise UsageError(f"sanitize=True is not allowed on the {cluster.backend} backend: the sanitizer watches "
                         f"kernels under the Triton interpreter, so use backend='cpu'")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout <= 86400):
        raise UsageError(f"timeout={timeout!r} is not allowed: use seconds from 0 to 86400, or None")
    _check_process_per_rank(cluster, "programs")
    plans = hooks.plans(hook_options)
    cluster.ensure_running()
    run = _ProgramRun(cluster, out or sys.stdout, err or sys.stderr, echo)
    run.path = path
    if echo:
        for line in hooks.descriptions(plans):
            print(f"[gemmar] {line}", file=run.err, flush=True)
    # Where this run's ranks meet for torch.distributed: a fresh file in the cluster's private folder.
    store_path = run.store_path = os.path.join(cluster.profile_dir, f"dist-{uuid.uuid4().hex}.store")
    run.pending = [cluster.client[eid].apply_async(rank_scripts.run_program, path, list(args), os.getcwd(),
                                                   store_path, plans, bool(sanitize))
                   for eid in cluster.engine_ids]
    try:
        with cluster.in_run():
            run.wait(timeout)
    except KeyboardInterrupt:
        cluster.stop_for_restart("its last program was interrupted and its ranks were stopped")
        raise
    finally:
        out_of_step = departures.out_of_step(store_path, cluster.world_size)
        departures.forget(store_path, cluster.world_size)
        with contextlib.suppress(OSError):
            os.remove(store_path)
    if run.stopped or any(e and e.startswith("its process") for e in run.errors):
        # a rank may spin forever on a flag: fresh ranks next time
        lost = run.stopped or [r for r, c in enumerate(run.exit_codes) if c]
        cluster.stop_for_restart(f"in its last program rank(s) {lost} were stopped or died")
    elif out_of_step:   # a heap barrier gave up on a rank that had ended: the ranks' barrier counts differ now
        cluster.stop_for_restart(f"in its last program the barrier of rank(s) {out_of_step} gave up on a rank "
                                 f"that had ended")
    result = ProgramResult(path, run.exit_codes, run.errors, run.stopped, run.timed_out, ended_at=run.ended_at)
    if sanitize and all(run.records):
        from ..sanitizer import analyse

        result.sanitizer = analyse(run.records)
        if echo:
            print(f"[gemmar] {result.sanitizer}", file=run.out, flush=True)
    return result


def _check_process_per_rank(cluster, what):
    if len(cluster.engine_ranks) != cluster.world_size:
        raise UsageError(f"{what} need one process per rank: this cluster's {cluster.world_size} ranks share "
                         f"one engine; start it with Cluster(..., process_per_rank=True)")


def _barrier_deadlock(places, running, world_size, timeout):
    """{rank: line} at the deadline when some ranks wait in a barrier (their line's code calls one: shmem.barrier(),
    dist.barrier(), Iris's own) that others never reached: a deadlock, said so, rather than "still running"."""
    def code(place):   # (the line's code, in whereabouts' form: "file.py:12 (code), from prog.py:3")
        return (re.match(r"\S+:\d+ \((.*?)\)(?:, from |$)", place) or [None, ""])[1]

    waiting = [r for r in running if "barrier" in code(places.get(r, ""))]
    absent = [r for r in range(world_size) if r not in waiting]
    if not waiting or not absent:
        return {}
    def names(ranks):
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"

    late = f"stopped at the {timeout:g} s deadline"
    lines = {r: f"deadlock: waits in the barrier at {places[r]}, which {names(absent)} never reached; {late}"
             for r in waiting}
    for r in set(running) - set(waiting):
        at = f": it was at {places[r]}" if r in places else ""
        lines[r] = f"never reached the barrier {names(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in{at}; {late}"
    return lines


class _ProgramRun:
    """One program running on every rank: its output shown line by line as it comes, each rank's exit code,
    error and sanitizer records, and the stopping of ranks after the deadline or another rank's failure."""

    def __init__(self, cluster, out, err, echo):
        W = cluster.world_size
        self.cluster, self.out, self.err, self.echo = cluster, out, err, echo
        self.pending = []
        self.path = None         # the program
        self.store_path = None   # where the ranks meet, and beside it the files their stacks go to (whereabouts)
        self.records = [None] * W
        self.shown = [[0, 0] for _ in range(W)]   # per rank: stdout, stderr characters shown (whole lines)
        self.exit_codes, self.errors, self.stopped = [None] * W, [None] * W, []
        self.ended_at = [None] * W
        self.timed_out = False
        self.told = []   # the ranks the others were last told have ended (tell_ranks)
        self.engine_lost_at = {}   # rank: when its call first came back as its engine's death

    def wait(self, timeout):
        """Until every rank has ended, or the rest were stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first_failure = None
        while any(code is None for code in self.exit_codes):
            self.stream()
            self.collect()
            # A rank that ended with an exit code of its own (as pytest does when a test failed) ended normally: the
            # others go on with their own work (a barrier waiting for it ends in a DeadlockError). A rank that raised
            # or died may leave the others waiting on it for ever: they get FAILURE_GRACE_S.
            failed = [r for r, c in enumerate(self.exit_codes) if c and not (self.errors[r] or "").startswith("exit code")]
            if failed and first_failure is None:
                first_failure = time.monotonic()
            running = [r for r, c in enumerate(self.exit_codes) if c is None]
            why = None
            if running and deadline is not None and time.monotonic() > deadline:
                why, self.timed_out = f"still running after the {timeout:g} s deadline: stopped", True
            elif running and first_failure is not None and time.monotonic() - first_failure > FAILURE_GRACE_S:
                why = f"stopped {FAILURE_GRACE_S:g} s after rank {failed[0]} failed"
            if why:
                self.stream(final=True)
                places = self.where(running)
                deadlock = _barrier_deadlock(places, running, len(self.exit_codes), timeout) if self.timed_out else {}
                for r in running:
                    at = f" (it was at {places[r]})" if r in places else ""
                    self.exit_codes[r], self.errors[r], self.ended_at[r] = 1, deadlock.get(r, why + at), time.time()
                self.stopped = running
                break
            time.sleep(0.05)
        if not self.stopped:
            time.sleep(0.1)   # the last output of ranks that just ended
        self.stream(final=True)

    def where(self, ranks):
        """The line each of ``ranks`` (still running) is at, by its own stack (``whereabouts.py``)."""
        pids = getattr(self.cluster, "pids", None) or []
        asked = {r: (pids[r], whereabouts.stack_file(self.store_path, r)) for r in ranks
                 if r < len(pids) and pids[r] and self.store_path}
        return whereabouts.ask(asked, is_program_file, self.path)

    def collect(self):
        """Exit codes of ranks whose process ended or froze, and of those whose call returned."""
        for i, (how, what) in self.cluster.deaths.lost().items():
            for r in self.cluster.deaths.ranks_of_process(i) or [i]:
                if self.exit_codes[r] is None:
                    self.exit_codes[r] = _signal_exit_code(what) if how == "died" else 1
                    self.errors[r] = what.replace("engine process", "its process")
                    self.ended_at[r] = time.time()
        for r, ar in enumerate(self.pending):
            if self.exit_codes[r] is None and ar.ready():
                outcome = self._outcome(ar)
                if (outcome["error"] or "").startswith("EngineError") and \
                        time.monotonic() - self.engine_lost_at.setdefault(r, time.monotonic()) < ENGINE_EXIT_WAIT_S:
                    # ipyparallel can tell that an engine died before its process is gone: wait a moment for
                    # the process (above), whose exit says how it ended (a signal, an exit code).
                    continue
                self.exit_codes[r], self.errors[r] = outcome["exit_code"], outcome["error"]
                self.ended_at[r] = outcome.get("ended_at") or time.time()   # (the rank's own clock, same host)
                self.records[r] = outcome.get("sanitizer")
        self.tell_ranks()

    def tell_ranks(self):
        """Tell the ranks still running which ranks have ended, and how (``departures.py``): a barrier waiting
        for one of them gives up at once. Ranks that ended because one had left are not named."""
        ended = [(self.ended_at[r], r, departures.how_it_ended(code, self.errors[r]))
                 for r, code in enumerate(self.exit_codes)
                 if code is not None and not (self.errors[r] or "").startswith("RankLeftError")]
        if ended != self.told and self.store_path:
            departures.tell_ranks(self.store_path, ended)
            self.told = ended

    def stream(self, final=False):
        """Print the whole lines each rank has written since the last call (``final``: the rest too)."""
        W = len(self.pending)
        for r, ar in enumerate(self.pending):
            for i, (text, to) in enumerate(((ar.stdout, self.out), (ar.stderr, self.err))):
                text = text if isinstance(text, str) else "".join(text or [])
                new = text[self.shown[r][i]:]
                self.shown[r][i] = len(text)
                lines = new.split("\n")
                complete, rest = lines[:-1], lines[-1]
                if final and rest:
                    complete, rest = complete + [rest], ""
                for line in complete:
                    if self.echo:
                        print(f"[rank {r}/{W}] {line}", file=to, flush=True)
                self.shown[r][i] -= len(rest)

    @staticmethod
    def _outcome(ar):
        try:
            return ar.get()
        except Exception as e:  # noqa: BLE001 - gemmar's own refusal (one line) or the engine's failure
            ename = getattr(e, "ename", type(e).__name__)
            evalue = getattr(e, "evalue", str(e))
            return {"exit_code": 1, "error": f"{ename}: {evalue}".splitlines()[0]}


def activate(cluster, suffix="", **hook_options):
    """``Cluster.activate``: ipyparallel's ``%px`` magics over ``cluster``'s ranks, each rank made ready as for a
    program (``rank.prepare_cells``: with gemmar's Iris layer, ``import iris`` works in a cell; kernels run on
    gemmar's interpreter)."""
    _check_process_per_rank(cluster, "%%px cells")
    plans = hooks.plans(hook_options)
    cluster.run(rank_scripts.prepare_cells, plans, timeout=cluster.start_timeout_s)
    view = cluster.client[cluster.engine_ids]
    view.block = True
    view.activate(suffix)
    return view
