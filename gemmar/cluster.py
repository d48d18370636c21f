"""ipyparallel engines acting as ranks.

``Cluster(world_size=3)`` starts a controller and ``world_size`` local engines; engine ids sorted give ranks
0..W-1. Each engine builds its symmetric heap (``gemmar.rank.init_rank``) and meets the others. Calls run
on every rank at the same time and come back as a list indexed by rank. ``stop()`` ends the engines and
removes any heap file a dead rank may have left in /dev/shm; a stopped cluster can be started again.
"""

import atexit
import functools
import logging
import os
import sys
import time
import uuid
import weakref
from dataclasses import dataclass, field

import numpy as np
import psutil
import torch

from . import rank as rank_runtime
from .config import BACKENDS, MAX_WORLD_SIZE, RunConfig, k_bounds
from .errors import ClusterError, DeadlockError, GemmarError, RankDiedError, UsageError
from .heap import DEFAULT_HEAP_BYTES, deadlock_message, remove_arenas


def log(rank, world_size, message, file=None):
    """The one progress-line format: ``[gemmar] [r/W] message`` (rank '-' for the client)."""
    print(f"[gemmar] [{rank}/{world_size}] {message}", file=file or sys.stdout, flush=True)


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


@dataclass
class Result:
    """What one fused GEMM + all-reduce run gave back, from every rank."""

    config: RunConfig
    backend: str
    ranks: list                      # per rank: max_abs_diff, seconds per iteration, tolerance, ...
    C: torch.Tensor = None           # rank 0's all-reduced C (fp32), when asked for
    info: list = field(default_factory=list)  # per rank: device, versions, pid
    mistake: str = "none"

    @property
    def max_abs_diff(self):
        diffs = [d for r in self.ranks for d in r["max_abs_diff"] if d is not None]
        return max(diffs) if diffs else None

    @property
    def ok(self):
        """Every rank matched the reference within tolerance after every iteration."""
        return all(d is not None and d <= r["tolerance"] for r in self.ranks for d in r["max_abs_diff"])

    @property
    def seconds(self):
        """Per iteration, the slowest rank's time (the all-reduce is done when the last rank is)."""
        return [max(r["seconds"][i] for r in self.ranks) for i in range(self.config.iterations)]

    @functools.cached_property
    def trace(self):
        """The run's Trace (built once, on first use)."""
        from .trace import Trace

        return Trace.from_result(self)


class Cluster:
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
        return f"Cluster(world_size={self.world_size}, backend={self.backend!r}, {state})"

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
            if isinstance(out, dict) and out.get("error") == "deadlock":
                seen.append(out["message"].replace("deadlock: ", ""))
            elif isinstance(out, dict) and "error" in out:
                seen.append(f"rank {r}: {out['message']}")
            else:
                seen.append(f"rank {r} finished")
        pids = ", ".join(str(self.pids[r]) for r in dead)
        released = f"; the others were released: {'; '.join(seen)}" if seen else ""
        raise RankDiedError(f"rank {', '.join(map(str, dead))} died during the run (engine process {pids} "
                            f"exited){released}; call restart() to start fresh ranks", dead)

    # -- the fused GEMM + all-reduce ------------------------------------------------------------------
    def bench(self, config=None, validate=True, verbose=False, mistake="none", return_c=False, on_progress=None,
              **settings):
        """Run with seeded inputs built on each rank (nothing but settings travel). Returns a Result.

        ``on_progress(rank, {"iteration", "max_abs_diff", "seconds"})`` is called as ranks finish iterations.
        """
        config = (config or RunConfig(world_size=self.world_size))
        config = RunConfig(**{**config.to_dict(), **settings, "world_size": self.world_size}).validate()
        return self._run(config, None, validate, verbose, mistake, return_c, on_progress)

    def gemm_all_reduce(self, A, B, algorithm="ring", block=(32, 32, 32), iterations=1, gsize_m=4, num_sms=4,
                        trace=False, validate=True, mistake="none", verbose=False, timeout_s=None):
        """C = A @ B with K split over the ranks, reduced by ``algorithm``; checked against torch.

        A is M x K and B is K x N (fp16, bf16 or fp32, same dtype). Rank r gets ``A[:, K_r]`` and
        ``B[K_r, :]``; every rank ends with all of C, checked against a float64 reference after every
        iteration. Returns a Result whose ``C`` is rank 0's copy.
        """
        for name, t in (("A", A), ("B", B)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise UsageError(f"{name} must be a 2-D torch tensor, got {type(t).__name__}")
        if A.shape[1] != B.shape[0]:
            raise UsageError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: A's columns must equal B's rows")
        if A.dtype != B.dtype:
            raise UsageError(f"A is {A.dtype} and B is {B.dtype}: use the same dtype for both")
        if len(block) != 3:
            raise UsageError(f"block={block!r} is not allowed: use (BLK_M, BLK_N, BLK_K)")
        config = RunConfig(m=A.shape[0], n=B.shape[1], k=A.shape[1], datatype=A.dtype, algorithm=algorithm,
                           BLK_M=block[0], BLK_N=block[1], BLK_K=block[2], gsize_m=gsize_m, num_sms=num_sms,
                           world_size=self.world_size, iterations=iterations, trace=trace,
                           timeout_s=timeout_s or self.timeout_s).validate()
        A, B = A.detach().cpu(), B.detach().cpu()
        reference = A.double() @ B.double()
        slices = [k_bounds(config.k, self.world_size, r) for r in range(self.world_size)]
        inputs = [(A[:, s:e].contiguous(), B[s:e, :].contiguous()) for s, e in slices]
        return self._run(config, (inputs, reference), validate, verbose, mistake, True)

    def benchmark(self, configs, reps=20, warmup=5, baseline=True):
        """GPU only: time each fused kernel and the unfused baseline (cuBLAS matmul, NCCL all-reduce, both in
        sequence) in one run. ``configs`` maps an algorithm to its RunConfig (same shape for all; a single
        RunConfig times just its own algorithm). Returns milliseconds, the slowest rank's each."""
        if isinstance(configs, RunConfig):
            configs = {configs.algorithm: configs}
        dicts = {}
        for alg, cfg in configs.items():
            dicts[alg] = RunConfig(**{**cfg.to_dict(), "algorithm": alg, "world_size": self.world_size}).validate() \
                .to_dict()
        shapes = {(d["m"], d["n"], d["k"], d["datatype"], d["seed"]) for d in dicts.values()}
        if len(shapes) != 1:
            raise UsageError(f"benchmark configs must share one shape, dtype and seed; got {sorted(shapes)}")
        outs = self.run(rank_runtime.benchmark_rank, dicts, reps, warmup, baseline)
        _raise_rank_errors(outs)
        figures = {f"{alg}_ms": max(o["fused_ms"][alg] for o in outs) for alg in dicts}
        figures.update({f"{alg}_max_abs_diff": max(o["max_abs_diff"][alg] for o in outs) for alg in dicts})
        figures["tolerance"] = outs[0]["tolerance"]
        if baseline:
            for key in ("matmul_ms", "allreduce_ms", "sequential_ms"):
                figures[key] = max(o[key] for o in outs)
            figures["bound_ms"] = max(figures["matmul_ms"], figures["allreduce_ms"])
        return figures

    def _run(self, config, data, validate, verbose, mistake, return_c, on_progress=None):
        W, n = self.world_size, config.iterations

        def progress(r, d):
            if on_progress is not None:
                on_progress(r, d)
            if verbose:
                diff = "" if d.get("max_abs_diff") is None else f"  max|C - ref| = {d['max_abs_diff']:.3g}"
                log(r, W, f"{config.algorithm} iteration {d['iteration']}/{n}  {d['seconds'] * 1e3:.1f} ms{diff}")

        def rank_args(r):
            if data is None:
                return (config.to_dict(),)
            inputs, reference = data
            return (config.to_dict(), inputs[r][0], inputs[r][1], reference)

        if verbose:
            log("-", W, f"{config.algorithm}: {config.m} x {config.n} x {config.k} {config.datatype}, blocks "
                        f"{config.BLK_M}x{config.BLK_N}x{config.BLK_K}, {config.num_sms} programs per rank, "
                        f"{n} iteration(s), backend {self.backend}")
        outs = self.run(rank_runtime.run_gemm_all_reduce, rank_args=rank_args, on_progress=progress,
                        mistake=mistake, return_c=return_c, validate=validate)
        _raise_rank_errors(outs)
        result = Result(config, self.backend, outs, outs[0].get("C"), self.info, mistake)
        if verbose and validate:
            for r, out in enumerate(outs):
                worst = max(out["max_abs_diff"])
                verdict = "ok" if worst <= out["tolerance"] else "MISMATCH"
                log(r, W, f"{verdict}: max|C - ref| = {worst:.3g} over {n} iteration(s) (tolerance "
                          f"{out['tolerance']:.3g})")
        return result


def _raise_rank_errors(outs):
    usage = [o for o in outs if o.get("error") == "usage"]
    if usage:
        raise UsageError(usage[0]["message"])
    waits = [w for o in outs if o.get("error") == "deadlock" for w in o["waits"]]
    if waits:
        raise DeadlockError(deadlock_message(waits), waits)
    if any("error" in o for o in outs):
        raise GemmarError("; ".join(o["message"] for o in outs if "error" in o))


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
