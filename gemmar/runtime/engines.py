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
import time
import uuid
import weakref

import psutil
import torch

from ..config import BACKENDS, MAX_WORLD_SIZE
from ..errors import ClusterError, RankDiedError, UsageError
from . import rank as rank_runtime
from .heap import DEFAULT_HEAP_BYTES, remove_arenas
from .results import RankFailure


def gpu_properties(backend):
    """(name, compute capability, multiprocessors) of GPU 0 as the client sees it; blanks off the GPU."""
    if backend != "cuda":
        return "", (0, 0), 0
    props = torch.cuda.get_device_properties(0)
    return props.name, (props.major, props.minor), props.multi_processor_count


def resolve_backend(backend, world_size):
    """'auto' -> cuda when enough GPUs are present, else cpu. Checks that the choice can run here."""
    if backend not in BACKENDS:
        raise UsageError(f"backend {backend!r} is not known: use one of {', '.join(BACKENDS)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        backend = "cuda" if gpus >= world_size and torch.version.hip is None else "cpu"
    if backend == "cuda" and world_size > gpus:
        raise UsageError(f"world_size={world_size} needs {world_size} GPUs; this machine has {gpus}: "
                         f"use at most {gpus} ranks, or backend='cpu'")
    if backend == "iris":
        try:
            import iris  # noqa: F401
        except ImportError:
            raise UsageError("backend 'iris' needs Iris installed (import iris failed): use cpu or cuda") from None
    return backend


class EngineCluster:
    def __init__(self, world_size=2, backend="auto", heap_size=DEFAULT_HEAP_BYTES, start_timeout_s=120.0,
                 timeout_s=60.0, start=True):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD_SIZE:
            raise UsageError(f"world_size={world_size!r} is not allowed: use a whole number from 1 to {MAX_WORLD_SIZE}")
        self.world_size = world_size
        self.backend = resolve_backend(backend, world_size)
        self.heap_size = int(heap_size)
        self.start_timeout_s, self.timeout_s = start_timeout_s, timeout_s
        self._ipp = self.client = None
        self.info = []
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
        env = {"TRITON_INTERPRET": "1" if self.backend == "cpu" else "0", "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1"}
        for var in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
            env[var] = os.environ.get(var, "1" if var != "NCCL_NVLS_ENABLE" else "0")
        # ipyparallel's own exit hook can stall a closing Jupyter kernel for minutes; ours kills the engines.
        # ERROR: stopping engines makes them exit 1, and ipyparallel would log their whole output as a warning.
        self._ipp = ipp.Cluster(n=self.world_size, cluster_id=self.cluster_id, log_level=logging.ERROR,
                                shutdown_atexit=False)
        atexit.register(_stop_at_exit, weakref.ref(self))
        try:
            self._ipp.start_controller_sync()
            self._ipp.start_engines_sync(self.world_size, environment=env)
            self.client = self._ipp.connect_client_sync()
            try:
                self.client.wait_for_engines(self.world_size, timeout=self.start_timeout_s, block=True)
            except TimeoutError:
                raise ClusterError(f"only {len(self.client.ids)} of {self.world_size} engines came up within "
                                   f"{self.start_timeout_s:g} s (start_timeout_s); see the engine logs in "
                                   f"{self._ipp.profile_dir}") from None
            self.engine_ids = sorted(self.client.ids)[: self.world_size]
            self.pids = [None] * self.world_size
            self.info = self.run(rank_runtime.init_rank, rank_args=lambda r: (r, self.world_size, self.backend,
                                                                              self.heap_size, self.cluster_id,
                                                                              self.timeout_s),
                                 timeout=self.start_timeout_s)
            self.pids = [i["pid"] for i in self.info]
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """End every engine and the controller; leave no process and no heap file behind."""
        if self._ipp is None:
            return
        try:
            if self.client is not None:
                self.client.close()
            self._ipp.stop_cluster_sync()
        finally:
            for pid in getattr(self, "pids", []) or []:
                _kill(pid)
            remove_arenas(self.cluster_id)
            self._ipp = self.client = None

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
        return f"{type(self).__name__}(world_size={self.world_size}, backend={self.backend!r}, {state})"

    # -- running on all ranks -------------------------------------------------------------------------
    def run(self, fn, *args, rank_args=None, timeout=None, on_progress=None, **kwargs):
        """Call ``fn`` on every rank at once; return the results as a list indexed by rank.

        ``rank_args(rank)`` gives per-rank positional arguments (replacing ``args``). ``on_progress(rank,
        data)`` sees what ranks publish while they run. A rank whose process dies raises RankDiedError.
        """
        if not self.running:
            raise ClusterError("the cluster is not running: call start() (or restart()) first")
        pending = []
        for r, eid in enumerate(self.engine_ids):
            call_args = rank_args(r) if rank_args else args
            pending.append(self.client[eid].apply_async(fn, *call_args, **kwargs))
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = [None] * self.world_size
        while not all(ar.ready() for ar in pending):
            for r, ar in enumerate(pending):
                if on_progress is not None and ar.data and ar.data != seen[r]:
                    seen[r] = dict(ar.data)
                    on_progress(r, seen[r])
            dead = [r for r, pid in enumerate(self.pids) if pid is not None and not _alive(pid)]
            if dead:
                self._raise_rank_died(dead, pending)
            if deadline is not None and time.monotonic() > deadline:
                late = [r for r, ar in enumerate(pending) if not ar.ready()]
                raise ClusterError(f"ranks {late} did not answer within {timeout:g} s; call restart()")
            time.sleep(0.02)
        results = []
        for r, ar in enumerate(pending):
            try:
                results.append(ar.get())
            except Exception as e:  # a bug on the engine: say which rank, keep the remote traceback
                from ipyparallel.error import EngineError

                if isinstance(e, EngineError):
                    raise RankDiedError(f"rank {r} died during the run: {e}; call restart()", [r]) from None
                raise
            if on_progress is not None and ar.data and ar.data != seen[r]:
                on_progress(r, dict(ar.data))
        return results

    def _raise_rank_died(self, dead, pending):
        """A rank's process is gone. The others may be spinning on flags it will never set: their
        watchdogs release them within timeout_s; wait that long (no longer) and report what they saw."""
        deadline = time.monotonic() + self.timeout_s + 15
        alive = [r for r in range(self.world_size) if r not in dead]
        while time.monotonic() < deadline and not all(pending[r].ready() for r in alive):
            time.sleep(0.05)
        seen = []
        for r in alive:
            if not pending[r].ready():
                seen.append(f"rank {r} still busy")
                continue
            try:
                out = pending[r].get()
            except Exception as e:  # noqa: BLE001 - reported, not raised: the dead rank is the story
                seen.append(f"rank {r}: {type(e).__name__}")
                continue
            if isinstance(out, RankFailure):
                seen.append(str(out.error).replace("deadlock: ", ""))
            else:
                seen.append(f"rank {r} finished")
        pids = ", ".join(str(self.pids[r]) for r in dead)
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
