"""ipyparallel engines acting as ranks: start, stop, restart, run a function on every rank, notice deaths.

``EngineCluster(world_size=3)`` starts a controller and ``world_size`` local engines; engine ids sorted give
ranks 0..W-1. Each engine builds its symmetric heap (``runtime.rank.init_ranks``) and meets the others.
Calls run on every rank at the same time and come back as a list indexed by rank. ``stop()`` ends the
engines and removes any heap file a dead rank may have left in /dev/shm; a stopped cluster can be started
again. The GEMM API on top of this is ``gemmar.Cluster``. Which backend and how many GPUs: ``backends.py``;
process helpers (exit codes, sessions): ``processes.py``.
"""

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref

import psutil

from ..config import MIN_TIMEOUT_S
from ..errors import ClusterError, GemmarError, HeapBoundsError, RankDiedError, UsageError
from . import limits, memory, rank as rank_runtime
from .heap import DEFAULT_HEAP_BYTES, make_heap_folder, remove_arenas, shm_dir
from .heap.cpu import private_folder
from .backends import check_heap_fits, check_world_size, resolve_backend, shares_gpu
from .deaths import DeathWatch
from .processes import _children, _kill, _session, start_stamp
from .reaper import TAG_VARIABLE, end_sessions
from .restarts import RestartsEarly, interactive
from .results import RankFailure


class EngineCluster(RestartsEarly):
    def __init__(self, world_size=2, backend="auto", heap_size=DEFAULT_HEAP_BYTES, start_timeout_s=120.0,
                 timeout_s=60.0, start=True, process_per_rank=False):
        check_world_size(world_size)
        for name, value, least in (("timeout_s", timeout_s, MIN_TIMEOUT_S), ("start_timeout_s", start_timeout_s, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not least <= value <= 86400 or \
                    value == 0:
                raise UsageError(f"{name}={value!r} is not allowed: use seconds from {least:g} to 86400"
                                 if least else f"{name}={value!r} is not allowed: use seconds between 0 and 86400")
        self.world_size = world_size
        self.backend = resolve_backend(backend, world_size)
        # Which ranks each engine hosts: one each, or all in one engine when they share a GPU (unless
        # ``process_per_rank``, which programs written for one process per rank need: heap/cuda.py's IPC layout).
        self.shares_gpu = shares_gpu(self.backend, world_size)
        one_engine = self.shares_gpu and not process_per_rank
        self.engine_ranks = [list(range(world_size))] if one_engine else [[r] for r in range(world_size)]
        check_heap_fits(self.backend, world_size, heap_size)
        memory.check_fits(len(self.engine_ranks) * memory.ENGINE_BYTES,
                          f"{len(self.engine_ranks)} engine process(es) (Python, torch and Triton in each)",
                          "use fewer ranks")
        self.heap_size = heap_size
        self.start_timeout_s, self.timeout_s = start_timeout_s, timeout_s
        self._ipp = self.client = self._reaper = None
        self.info = []
        self._sessions = set()
        self._stopped_during_run = threading.Event()
        self._stop_lock = threading.RLock()   # stop() from two threads at once: the second waits for the first
        self._restart_reason = None   # why the last run stopped the ranks; the next run starts fresh ones
        self._in_run = False
        self._owner_pid = os.getpid()   # only this process stops the cluster (not a forked child)
        # Interactive use (a notebook, IPython): ranks stopped by a hang or a crash are started again at once, in the
        # background, so that the next call (a puzzle's check) finds them up instead of waiting a whole start.
        self.restart_early = interactive()
        self._early_start = None   # the thread of that start, while it runs
        self.deaths = DeathWatch()   # the engine processes of the current start, watched
        if start:
            self.start()

    # -- life cycle -----------------------------------------------------------------------------------
    @property
    def running(self):
        early = getattr(self, "_early_start", None)
        if early is not None and early.is_alive() and early is not threading.current_thread():
            return False   # (being started again in the background: not ready yet)
        return self.client is not None

    @property
    def restart_reason(self):
        """Why the last run stopped every rank (a rank died, froze or was interrupted), or None; the next
        call starts fresh ranks."""
        return self._restart_reason

    def start(self):
        self._wait_for_early_start()
        if self.running:
            if threading.current_thread() is not self._early_start:
                self._restart_reason = None   # (started early, in the background: the caller has said why)
            return self
        self.cluster_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._owner_pid = os.getpid()
        if threading.current_thread() is not self._early_start:   # (the next call says why the ranks are new)
            self._restart_reason = None
        self._stopped_during_run.clear()
        # A private ipyparallel profile: this cluster's logs and connection files only, removed on stop; and a
        # private folder in /dev/shm for the heaps (both 0700, random names: nothing another user can take).
        engines = len(self.engine_ranks)
        limits.check_can_start(self.world_size, engines, self.backend, shm_dir())
        self.profile_dir = self.heap_folder = None
        try:
            self._start_reaper()   # first: it is told each folder before the folder exists
            announce = lambda path: self._tell_reaper(f"tree {path}")  # noqa: E731
            self.profile_dir = private_folder(tempfile.gettempdir(), f"gemmar-{self.cluster_id}-ipython-", announce)
            self.heap_folder = make_heap_folder(announce)
            self._ipp, env = self._ipyparallel_cluster()
            atexit.register(_stop_at_exit, weakref.ref(self))
            self._ipp.start_controller_sync(environment={"IPYTHONDIR": self.profile_dir, TAG_VARIABLE: self.cluster_id})
            self._adopt([self._ipp.controller.pid])
            self._ipp.start_engines_sync(engines, environment=env)
            launchers = [launcher for engine_set in self._ipp.engines.values()
                         for launcher in engine_set.launchers.values()]
            self._adopt([launcher.pid for launcher in launchers])
            # The engine processes (our children, so their exit codes can be read when they die).
            self.deaths = DeathWatch([getattr(launcher, "process", None) or psutil.Process(launcher.pid)
                                      for launcher in launchers], self.engine_ranks)
            if len(launchers) < engines:   # (ipyparallel forgets the launcher of an engine that has ended)
                raise RankDiedError(f"an engine died while the cluster started: {len(launchers)} of {engines} "
                                    f"engine processes are left; nothing ran", [])
            self.client = self._ipp.connect_client_sync(ipython_dir=self.profile_dir)
            self._wait_for_engines(engines)
            self._adopt_descendants()   # the engines' nannies, each in a session of its own
            self.engine_ids = sorted(self.client.ids)[:engines]
            self.run(rank_runtime.watch_owner, os.getpid(), start_stamp(os.getpid()), sorted(self._sessions),
                     [], [self.profile_dir, self.heap_folder], [self.cluster_id], timeout=self.start_timeout_s)
            self.pids = [None] * self.world_size
            self.info = self.run_ranks(rank_runtime.init_ranks, engine_args=lambda e: (
                self.engine_ranks[e], self.world_size, self.backend, self.heap_size, self.heap_folder,
                self.timeout_s, self.start_timeout_s), timeout=self.start_timeout_s)
            RankFailure.raise_first(self.info)   # a rank that could not build its heap, in one line
            self.pids = self.deaths.pids = [i["pid"] for i in self.info]
        except (GemmarError, KeyboardInterrupt, SystemExit):
            self.stop()
            raise
        except Exception as e:   # an OS limit met meanwhile, ipyparallel's controller gone: one line, not 30
            self.stop()
            raise limits.start_failure(e, self.world_size) from e
        return self

    def _ipyparallel_cluster(self):
        """The ipyparallel cluster of this start (not started yet), and the engines' environment."""
        import ipyparallel as ipp

        env = {"TRITON_INTERPRET": "1" if self.backend == "cpu" else "0", "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1", "IPYTHONDIR": self.profile_dir,   # nothing written to ~/.ipython
               TAG_VARIABLE: self.cluster_id}   # inherited by all they start: the reaper finds those by it
        for var in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
            env[var] = os.environ.get(var, "1" if var != "NCCL_NVLS_ENABLE" else "0")
        # ipyparallel's own exit hook can stall a closing Jupyter kernel for minutes; ours kills the engines.
        # ERROR: stopping engines makes them exit 1, and ipyparallel would log their whole output as a warning.
        # CurveZMQ on every channel: its listeners are on 127.0.0.1, where any local user could connect, read
        # (a PUB socket sends to any subscriber) and forge; without the controller's key, kept in the 0700
        # profile, no handshake completes, so nothing is heard and nothing gets in.
        # An engine is registered at the controller's next heartbeat: every 0.5 s rather than ipyparallel's 3 s
        # starts a cluster sooner; 60 missed beats, not 10, before an engine is dropped keeps that at 30 s, as it
        # was (docs/decisions.md, Engine heartbeat; gemmar watches the engine processes itself: deaths.py).
        cluster = ipp.Cluster(n=self.world_size, cluster_id=self.cluster_id, log_level=logging.ERROR,
                              shutdown_atexit=False, profile_dir=self.profile_dir,
                              controller_args=["--IPController.enable_curve=True", "--HeartMonitor.period=500",
                                               "--HeartMonitor.max_heartmonitor_misses=60"])
        return cluster, env

    def _wait_for_engines(self, engines):
        """Wait for the engines to register; an engine that dies meanwhile is an error at once."""
        deadline = time.monotonic() + self.start_timeout_s
        # (Polled here: ipyparallel's wait_for_engines can block past its timeout once an engine has died.)
        while len(self.client.ids) < engines:
            time.sleep(0.1)
            dead = self.deaths.dead()
            if dead:
                raise RankDiedError(f"an engine died while the cluster started ({'; '.join(dead.values())}); "
                                    f"nothing ran", [])
            if time.monotonic() > deadline:
                raise ClusterError(f"only {len(self.client.ids)} of {engines} engines came up within "
                                   f"{self.start_timeout_s:g} s (start_timeout_s)") from None

    def _start_reaper(self):
        """The process that ends this cluster if its owner (this process) dies first (see runtime/reaper.py)."""
        self._reaper = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "reaper.py")],
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, text=True)
        self._tell_reaper(f"tag {self.cluster_id}")

    def _tell_reaper(self, *lines):
        self._reaper.stdin.write("".join(line + "\n" for line in lines))
        self._reaper.stdin.flush()

    def _adopt(self, pids):
        """Record the sessions these just-started processes lead: the cluster's processes are exactly the
        members of those sessions (a controller's children stay in its session when it dies)."""
        for pid in pids:
            try:
                sid = os.getsid(pid)
            except OSError:   # already gone: nothing to end
                continue
            if sid != os.getsid(0) and sid not in self._sessions:
                self._sessions.add(sid)
                self._tell_reaper(f"session {sid}")

    def _adopt_descendants(self):
        members = [p for p in psutil.Process().children(recursive=True) if _session(p.pid) in self._sessions]
        self._adopt([c.pid for p in members for c in _children(p)])

    def stop(self):
        """End every engine and the controller; leave no process and no file behind. Safe to call from
        another thread during a run: that run then ends at once with a ClusterError that says so. In a
        process forked from the owner this does nothing: the cluster is the owner's."""
        if os.getpid() != self._owner_pid:
            return
        if self._in_run:
            self._stopped_during_run.set()
        with self._stop_lock:
            self._stop_now()

    def _stop_now(self):
        if self._ipp is None:
            self._release_reaper()   # a start that failed before ipyparallel was set up, or already stopped
            return
        try:
            # Killed, not asked: ranks hold nothing to save, and a rank spinning on a flag would not listen.
            end_sessions(self._sessions, children_only=True, tags={self.cluster_id})
            if self.client is not None:
                self.client.close()
            self._ipp.stop_cluster_sync()
        finally:
            for pid in set(getattr(self, "pids", []) or []) - {None}:   # (in those sessions; in case one was missed)
                _kill(pid)
            self._ipp = self.client = None
            self._sessions = set()
            self._release_reaper()

    def _release_reaper(self):
        """Close our end of the reaper's pipe (it ends any straggler, removes the files, exits); remove the
        private profile now rather than wait for it."""
        if self._reaper is not None:
            self._reaper.stdin.close()
            threading.Thread(target=self._reaper.wait, daemon=True).start()   # (reaped when it exits)
            self._reaper = None
        if getattr(self, "profile_dir", None):
            shutil.rmtree(self.profile_dir, ignore_errors=True)
        remove_arenas(getattr(self, "heap_folder", None))

    def restart(self):
        self.stop()
        return self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass

    def __repr__(self):
        state = "running" if self.running else "stopped"
        shared = ", ranks share GPU 0" if self.shares_gpu else ""
        return f"{type(self).__name__}(world_size={self.world_size}, backend={self.backend!r}{shared}, {state})"

    # -- running on all ranks -------------------------------------------------------------------------
    def run(self, fn, *args, engine_args=None, timeout=None, on_progress=None, launch_deadline_s=None, **kwargs):
        """Call ``fn`` on every engine at once; return the results as a list indexed by engine, which is
        by rank when each engine is one rank (when ranks share a GPU, one engine hosts them all).

        ``engine_args(e)`` gives per-engine positional arguments (replacing ``args``). ``on_progress(rank,
        data)`` sees what ranks publish while they run (``{rank: data}`` per engine). A rank whose
        process dies or is stopped raises RankDiedError at once; so does an engine that has reported no
        progress for ``launch_deadline_s`` (runs of launches: each launch reports when it ends). Either way
        every rank is stopped and the next call starts fresh ones, saying so.
        """
        self.ensure_running()
        with self.in_run():
            try:
                results = self._run_on_engines(fn, args, kwargs, engine_args, timeout, on_progress,
                                               launch_deadline_s, stop_on=HeapBoundsError)
                self._stop_after_stray_access(results)
                return results
            except _StoppedBySanitizer as e:
                self.stop_for_restart(f"in its last run rank {e.failure.rank} stopped at an access outside its "
                                      f"buffer")
                raise e.failure.error from None
            except KeyboardInterrupt:
                # The ranks would go on with the interrupted work and the next call would queue behind it:
                # stop them now; the next call starts fresh ranks, and says so.
                self.stop_for_restart("its last run was interrupted and its ranks were stopped", early=False)
                raise
            except RankDiedError as e:
                # The other ranks may spin on flags the dead or frozen one will never set: end them all now;
                # the next call starts fresh ranks and says so.
                self.stop_for_restart(f"in its last run {e}")
                raise

    @contextlib.contextmanager
    def in_run(self):
        """Marks a call on the ranks, so that a stop() from another thread ends it with a ClusterError."""
        self._in_run = True
        try:
            yield
        finally:
            self._in_run = False

    def _stop_after_stray_access(self, results):
        """A rank the sanitizer stopped mid-launch (HeapBoundsError) leaves its peers' flags and barrier counts
        behind theirs: fresh ranks for the next run (the error itself travels back as the rank's result)."""
        for item in results:
            for failure in item if isinstance(item, list) else [item]:
                if isinstance(getattr(failure, "error", None), HeapBoundsError):
                    raise _StoppedBySanitizer(failure)

    def _check_not_stopped(self):
        if self._stopped_during_run.is_set():
            raise ClusterError("the run was stopped by the user: stop() was called while it ran; start() or "
                               "restart() the cluster to run again")

    def _run_on_engines(self, fn, args, kwargs, engine_args, timeout, on_progress, launch_deadline_s, stop_on=None):
        """(``stop_on``: an error class; a rank that returns a failure of it ends the wait for the others at once.)"""
        pending = []
        for e, eid in enumerate(self.engine_ids):
            call_args = engine_args(e) if engine_args else args
            pending.append(self.client[eid].apply_async(fn, *call_args, **kwargs))
        deadline = None if timeout is None else time.monotonic() + timeout
        seen, heard = {}, [time.monotonic()] * len(pending)   # heard: when each engine last published
        published = [{} for _ in pending]

        def report_progress():
            for e, ar in enumerate(pending):
                data = dict(ar.data or {})
                if data != published[e]:
                    published[e], heard[e] = data, time.monotonic()
                for rank, item in data.items():   # {rank: progress}, and other keys (e.g. "prepared")
                    if isinstance(rank, int) and isinstance(item, dict) and seen.get(rank) != item:
                        seen[rank] = dict(item)
                        if on_progress is not None:
                            on_progress(rank, seen[rank])

        while not all(ar.ready() for ar in pending):
            self._check_not_stopped()
            report_progress()
            lost = self.deaths.lost()
            for how in ("died", "froze"):
                if any(h == how for h, _ in lost.values()):
                    self.deaths.raise_rank_died({i: what for i, (h, what) in lost.items() if h == how}, seen, how)
            for e, ar in enumerate(pending):   # an engine that died or was interrupted says so at once
                if ar.ready() and not ar.successful():
                    self.deaths.raise_engine_failure(e, ar, seen)
                if stop_on is not None and ar.ready():   # (its peers may wait for it on a flag until the watchdog)
                    self._stop_after_stray_access([ar.get()])
            late = [e for e, ar in enumerate(pending) if not ar.ready()]
            if deadline is not None and time.monotonic() > deadline:
                ranks = [r for e in late for r in self.engine_ranks[e]]
                raise RankDiedError(f"ranks {ranks} did not answer within {timeout:g} s; they were stopped", ranks)
            if launch_deadline_s is not None:
                self.deaths.check_launches_finish(late, heard, seen, launch_deadline_s, self.heap_folder)
            time.sleep(0.02)
        results = []
        for e, ar in enumerate(pending):
            self.deaths.raise_engine_failure(e, ar, seen)
            results.append(ar.get())   # (a bug on the engine raises here, with its remote traceback)
        report_progress()
        return results

    def run_ranks(self, fn, *args, **kwargs):
        """Like :meth:`run` for functions that return one item per hosted rank: the items, by rank."""
        return [item for items in self.run(fn, *args, **kwargs) for item in items]

class _StoppedBySanitizer(Exception):
    def __init__(self, failure):
        super().__init__(str(failure.error))
        self.failure = failure


def _stop_at_exit(ref):
    cluster = ref()
    if cluster is not None:
        try:
            cluster.stop()
        except Exception:  # noqa: BLE001 - exiting anyway; stop() already kills what it can
            pass


