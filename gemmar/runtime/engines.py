"""ipyparallel engines acting as ranks: start, stop, restart, run a function on every rank, notice deaths.

``EngineCluster(world_size=3)`` starts a controller and ``world_size`` local engines; engine ids sorted give
ranks 0..W-1. Each engine builds its symmetric heap (``runtime.rank.init_rank``) and meets the others.
Calls run on every rank at the same time and come back as a list indexed by rank. ``stop()`` ends the
engines and removes any heap file a dead rank may have left in /dev/shm; a stopped cluster can be started
again. The GEMM API on top of this is ``gemmar.Cluster``.
"""

import atexit
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
import torch

from ..config import BACKENDS, MAX_WORLD_SIZE
from ..errors import ClusterError, RankDiedError, UsageError
from . import rank as rank_runtime
from .heap import ALIGN, DEFAULT_HEAP_BYTES, HEADER_BYTES, remove_arenas, shm_dir, size_text
from .heap.cpu import arena_prefix
from .reaper import end_sessions
from .results import RankFailure


def gpu_properties(backend):
    """(name, compute capability, multiprocessors) of GPU 0 as the client sees it; blanks off the GPU."""
    if backend != "cuda":
        return "", (0, 0), 0
    props = torch.cuda.get_device_properties(0)
    return props.name, (props.major, props.minor), props.multi_processor_count


def gpu_count():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def shares_gpu(backend, world_size):
    """True when the ranks share GPU 0 (cuda with more ranks than GPUs): one engine then hosts them all."""
    return backend == "cuda" and world_size > gpu_count()


def resolve_backend(backend, world_size):
    """'auto' -> cuda on an NVIDIA GPU (ranks share it when there are more ranks than GPUs), else cpu.
    Checks that the choice can run here."""
    if backend not in BACKENDS:
        raise UsageError(f"backend {backend!r} is not known: use one of {', '.join(BACKENDS)}")
    gpus = gpu_count()
    if backend == "auto":
        backend = "cuda" if gpus >= 1 and torch.version.hip is None else "cpu"
    if backend == "cuda" and gpus == 0:
        raise UsageError("backend 'cuda' needs an NVIDIA GPU; this machine has none: use backend='cpu'")
    if backend == "iris":
        try:
            import iris  # noqa: F401
        except ImportError:
            raise UsageError("backend 'iris' needs Iris installed (import iris failed): use cpu or cuda") from None
    return backend


def check_world_size(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise UsageError(f"world_size={world_size!r} is not allowed: use a whole number from 1 to {MAX_WORLD_SIZE}")


def check_heap_fits(backend, world_size, heap_size):
    """Before anything is allocated: a heap too small to hold anything, or (cpu) arenas that /dev/shm could
    not hold all at once (they are sparse files: a write past the free space kills the rank with SIGBUS)."""
    smallest = HEADER_BYTES + ALIGN
    if isinstance(heap_size, bool) or not isinstance(heap_size, int) or heap_size < smallest:
        raise UsageError(f"heap_size={heap_size!r} is not allowed: use whole bytes per rank, at least {smallest}")
    if backend == "cpu":
        free = shutil.disk_usage(shm_dir()).free
        if heap_size * world_size > free:
            raise UsageError(f"heap_size={heap_size} ({size_text(heap_size)}) x {world_size} ranks needs "
                             f"{size_text(heap_size * world_size)} of shared memory; {shm_dir()} has "
                             f"{size_text(free)} free: use a smaller heap_size")


class EngineCluster:
    def __init__(self, world_size=2, backend="auto", heap_size=DEFAULT_HEAP_BYTES, start_timeout_s=120.0,
                 timeout_s=60.0, start=True):
        check_world_size(world_size)
        for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
                raise UsageError(f"{name}={value!r} is not allowed: use seconds between 0 and 86400")
        self.world_size = world_size
        self.backend = resolve_backend(backend, world_size)
        # Which ranks each engine hosts: one each, or all in one engine when they share a GPU.
        self.shares_gpu = shares_gpu(self.backend, world_size)
        self.engine_ranks = [list(range(world_size))] if self.shares_gpu else [[r] for r in range(world_size)]
        check_heap_fits(self.backend, world_size, heap_size)
        self.heap_size = heap_size
        self.start_timeout_s, self.timeout_s = start_timeout_s, timeout_s
        self._ipp = self.client = self._reaper = None
        self.info = []
        self._sessions = set()
        self._stopped_during_run = threading.Event()
        self._interrupted = self._in_run = False
        if start:
            self.start()

    # -- life cycle -----------------------------------------------------------------------------------
    @property
    def running(self):
        return self.client is not None

    def start(self):
        import ipyparallel as ipp

        if self.running:
            return self
        self.cluster_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._interrupted = False
        self._stopped_during_run.clear()
        # A private ipyparallel profile: this cluster's logs and connection files only, removed on stop.
        self.profile_dir = tempfile.mkdtemp(prefix=f"gemmar-{self.cluster_id}-ipython-")
        self._start_reaper()
        env = {"TRITON_INTERPRET": "1" if self.backend == "cpu" else "0", "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1", "IPYTHONDIR": self.profile_dir}   # nothing written to ~/.ipython
        for var in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
            env[var] = os.environ.get(var, "1" if var != "NCCL_NVLS_ENABLE" else "0")
        # ipyparallel's own exit hook can stall a closing Jupyter kernel for minutes; ours kills the engines.
        # ERROR: stopping engines makes them exit 1, and ipyparallel would log their whole output as a warning.
        self._ipp = ipp.Cluster(n=self.world_size, cluster_id=self.cluster_id, log_level=logging.ERROR,
                                shutdown_atexit=False, profile_dir=self.profile_dir)
        atexit.register(_stop_at_exit, weakref.ref(self))
        try:
            engines = len(self.engine_ranks)
            self._ipp.start_controller_sync(environment={"IPYTHONDIR": self.profile_dir})
            self._adopt([self._ipp.controller.pid])
            self._ipp.start_engines_sync(engines, environment=env)
            self._adopt([launcher.pid for engine_set in self._ipp.engines.values()
                         for launcher in engine_set.launchers.values()])
            self.client = self._ipp.connect_client_sync(ipython_dir=self.profile_dir)
            try:
                self.client.wait_for_engines(engines, timeout=self.start_timeout_s, block=True)
            except TimeoutError:
                raise ClusterError(f"only {len(self.client.ids)} of {engines} engines came up within "
                                   f"{self.start_timeout_s:g} s (start_timeout_s)") from None
            self._adopt_descendants()   # the engines' nannies, each in a session of its own
            self.engine_ids = sorted(self.client.ids)[:engines]
            self.pids = [None] * self.world_size
            self.info = self.run_ranks(rank_runtime.init_ranks, engine_args=lambda e: (
                self.engine_ranks[e], self.world_size, self.backend, self.heap_size, self.cluster_id,
                self.timeout_s, self.start_timeout_s), timeout=self.start_timeout_s)
            RankFailure.raise_first(self.info)   # a rank that could not build its heap, in one line
            self.pids = [i["pid"] for i in self.info]
        except BaseException:
            self.stop()
            raise
        return self

    def _start_reaper(self):
        """The process that ends this cluster if its owner (this process) dies first (see runtime/reaper.py)."""
        self._reaper = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "reaper.py")],
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, text=True)
        self._tell_reaper(f"glob {os.path.join(shm_dir(), arena_prefix(self.cluster_id))}*",
                          f"tree {self.profile_dir}")

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
        another thread during a run: that run then ends at once with a ClusterError that says so."""
        if self._ipp is None:
            self._release_reaper()   # a start that failed before ipyparallel was set up
            return
        if self._in_run:
            self._stopped_during_run.set()
        try:
            # Killed, not asked: ranks hold nothing to save, and a rank spinning on a flag would not listen.
            end_sessions(self._sessions, children_only=True)
            if self.client is not None:
                self.client.close()
            self._ipp.stop_cluster_sync()
        finally:
            for pid in set(getattr(self, "pids", []) or []) - {None}:   # (in those sessions; in case one was missed)
                _kill(pid)
            remove_arenas(self.cluster_id)
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
    def run(self, fn, *args, engine_args=None, timeout=None, on_progress=None, **kwargs):
        """Call ``fn`` on every engine at once; return the results as a list indexed by engine, which is
        by rank when each engine is one rank (when ranks share a GPU, one engine hosts them all).

        ``engine_args(e)`` gives per-engine positional arguments (replacing ``args``). ``on_progress(rank,
        data)`` sees what ranks publish while they run (``{rank: data}`` per engine). A rank whose
        process dies raises RankDiedError.
        """
        if not self.running and self._interrupted:
            print("[gemmar] restarting the cluster: its last run was interrupted and its ranks were stopped",
                  file=sys.stderr, flush=True)
            self.start()
        if not self.running:
            raise ClusterError("the cluster is not running: call start() (or restart()) first")
        self._in_run = True
        try:
            return self._run_on_engines(fn, args, kwargs, engine_args, timeout, on_progress)
        except KeyboardInterrupt:
            # The ranks would go on with the interrupted work and the next call would queue behind it: stop
            # them now; the next call starts fresh ranks, and says so.
            self._in_run = False
            self.stop()
            self._interrupted = True
            raise
        finally:
            self._in_run = False

    def _check_not_stopped(self):
        if self._stopped_during_run.is_set():
            raise ClusterError("the run was stopped by the user: stop() was called while it ran; start() or "
                               "restart() the cluster to run again")

    def _run_on_engines(self, fn, args, kwargs, engine_args, timeout, on_progress):
        pending = []
        for e, eid in enumerate(self.engine_ids):
            call_args = engine_args(e) if engine_args else args
            pending.append(self.client[eid].apply_async(fn, *call_args, **kwargs))
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = {}

        def report_progress():
            for ar in pending:
                for rank, data in dict(ar.data or {}).items():
                    if on_progress is not None and isinstance(data, dict) and seen.get(rank) != data:
                        seen[rank] = dict(data)
                        on_progress(rank, seen[rank])

        while not all(ar.ready() for ar in pending):
            self._check_not_stopped()
            report_progress()
            dead = sorted({r for r, pid in enumerate(self.pids) if pid is not None and not _alive(pid)})
            if dead:
                self._raise_rank_died(dead, pending)
            if deadline is not None and time.monotonic() > deadline:
                late = [r for e, ar in enumerate(pending) if not ar.ready() for r in self.engine_ranks[e]]
                raise ClusterError(f"ranks {late} did not answer within {timeout:g} s; call restart()")
            time.sleep(0.02)
        results = []
        for e, ar in enumerate(pending):
            try:
                results.append(ar.get())
            except Exception as err:  # a bug on the engine: say which rank, keep the remote traceback
                from ipyparallel.error import EngineError

                if isinstance(err, EngineError):
                    ranks = self.engine_ranks[e]
                    raise RankDiedError(f"rank {', '.join(map(str, ranks))} died during the run: {err}; "
                                        f"call restart()", ranks) from None
                raise
        report_progress()
        return results

    def run_ranks(self, fn, *args, **kwargs):
        """Like :meth:`run` for functions that return one item per hosted rank: the items, by rank."""
        return [item for items in self.run(fn, *args, **kwargs) for item in items]

    def _raise_rank_died(self, dead, pending):
        """A rank's process is gone. The others may be spinning on flags it will never set: their
        watchdogs release them within timeout_s; wait that long (no longer) and report what they saw."""
        deadline = time.monotonic() + self.timeout_s + 15
        alive = [e for e, ranks in enumerate(self.engine_ranks) if not set(ranks) & set(dead)]
        while time.monotonic() < deadline and not all(pending[e].ready() for e in alive):
            self._check_not_stopped()   # stop() killed it: that, not a crash, is the story
            time.sleep(0.05)
        seen = []
        for e in alive:
            ranks = ", ".join(map(str, self.engine_ranks[e]))
            if not pending[e].ready():
                seen.append(f"rank {ranks} still busy")
                continue
            try:
                out = pending[e].get()
            except Exception as err:  # noqa: BLE001 - reported, not raised: the dead rank is the story
                seen.append(f"rank {ranks}: {type(err).__name__}")
                continue
            failures = [o for o in (out if isinstance(out, list) else [out]) if isinstance(o, RankFailure)]
            if failures:
                seen.extend(str(f.error).replace("deadlock: ", "") for f in failures)
            else:
                seen.append(f"rank {ranks} finished")
        pids = ", ".join(sorted({str(self.pids[r]) for r in dead}))
        released = f"; the others were released: {'; '.join(seen)}" if seen else ""
        raise RankDiedError(f"rank {', '.join(map(str, dead))} died during the run (engine process {pids} "
                            f"exited){released}; call restart() to start fresh ranks", dead)


def _stop_at_exit(ref):
    cluster = ref()
    if cluster is not None:
        try:
            cluster.stop()
        except Exception:  # noqa: BLE001 - exiting anyway; stop() already kills what it can
            pass


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
