"""What runs inside each engine: one rank's heap, inputs, launches and checks.

The client (``gemmar.Cluster``) calls these functions on every engine at the same time. Each engine keeps
one :class:`RankContext` for its lifetime. The inputs, references and tolerances are in ``problem.py``;
GPU timing against cuBLAS + NCCL in ``timing.py``; the standalone all-reduce's rank side in ``allreduce.py``. Results travel back as :class:`RankResult`; errors that the user
must see (bad input, a deadlock) travel back as :class:`RankFailure`, so the client can raise one exception
with every rank's view.
"""

import contextlib
import dataclasses
import functools
import os
import platform
import threading
import time

import numpy as np
import torch

from ..errors import DeadlockError, GemmarError, HeapBoundsError, UsageError, gemmar_cause
from .heap import barrier_all, create_heap
from .. import sanitizer
from .launch import FusedGemmAllReduce, launch_ranks
from .problem import rank_slice, scale_inputs, seeded_problem, tolerance
from .shipping import failure_text, gemmars_own, load_parts, unship
from .results import RankFailure, RankResult

_ranks = []   # the RankContexts this engine hosts: one, or every rank when they share a GPU


class RankContext:
    def __init__(self, rank, world_size, backend, heap):
        self.rank, self.world_size, self.backend, self.heap = rank, world_size, backend, heap


def local_ranks():
    """The ranks this engine hosts, in rank order."""
    if not _ranks:
        raise RuntimeError("this process is not a gemmar rank: start it through gemmar.Cluster")
    return list(_ranks)


# The exit code of an engine that found its owner gone and ended the cluster (deaths.py says so in words).
OWNER_GONE_EXIT = 75


def watch_owner(owner_pid, owner_started, sessions, patterns, trees, tags=(), every_s=0.5):
    """The second line of defence: a thread in this engine that ends the whole cluster (reaper.end_cluster)
    and this process when the process that owns the cluster is gone, should the reaper be gone too. Also
    makes this engine the subreaper of what it starts (processes.become_subreaper)."""
    import psutil

    from .processes import become_subreaper, start_stamp
    from .reaper import end_cluster

    become_subreaper()

    def owner_alive():
        try:   # (the stamp, not the pid alone: a pid is reused once its process is gone)
            return start_stamp(owner_pid) == owner_started and psutil.Process(owner_pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def watch():
        while owner_alive():
            time.sleep(every_s)
        end_cluster(set(sessions), patterns, trees, set(tags))
        os._exit(OWNER_GONE_EXIT)

    threading.Thread(target=watch, name="gemmar-owner-watch", daemon=True).start()


def init_ranks(ranks, world_size, backend, heap_size, heap_folder, timeout_s, start_timeout_s=None):
    """Make this engine host ``ranks``: pin the device, build each rank's heap, meet the other ranks.

    One rank per engine on cpu and on cuda with a GPU per rank; every rank in this engine when several
    ranks share GPU 0 (each on its own stream, see ``heap/cuda.py``). ``heap_folder``: the cluster's
    private folder for heap files and rendezvous stores (``heap.make_heap_folder``).
    """
    try:
        # Meeting the other ranks may take as long as starting them; the waits of runs get timeout_s.
        return _init_ranks(ranks, world_size, backend, heap_size, heap_folder, timeout_s,
                           max(timeout_s, start_timeout_s or 0))
    except GemmarError as e:   # travels back as one line, not as a remote traceback
        return [RankFailure(r, e) for r in ranks]


def _init_ranks(ranks, world_size, backend, heap_size, heap_folder, timeout_s, meet_timeout_s):
    global _ranks, _progress_file
    _progress_file = progress_path(heap_folder, ranks[0])
    torch.set_num_threads(1)   # ranks share the machine's cores; one thread each is fastest
    if backend == "cuda" and len(ranks) > 1:
        from .heap.cuda import CudaHeap

        heaps = CudaHeap.create_shared(world_size, heap_size, meet_timeout_s)
        barrier_all(heaps, meet_timeout_s)
    else:
        (rank,) = ranks
        if backend == "cuda" and world_size > torch.cuda.device_count():   # a process per rank, one GPU
            from .heap.cuda import CudaHeap

            heaps = {rank: CudaHeap.create_ipc(rank, world_size, heap_size, heap_folder, meet_timeout_s)}
        else:
            if backend == "cuda":
                torch.cuda.set_device(rank)
            heaps = {rank: create_heap(backend, rank, world_size, heap_size, heap_folder, meet_timeout_s)}
    for r in ranks:   # (heaps: a list by rank when the ranks share a GPU, else {rank: heap})
        heaps[r].timeout_s = timeout_s
    _ranks = [RankContext(r, world_size, backend, heaps[r]) for r in ranks]
    return describe()


def describe():
    """One dict per hosted rank: pid, device, versions, heap size."""
    import triton

    out = []
    for ctx in local_ranks():
        dev = ctx.heap.device
        device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
        out.append(dict(rank=ctx.rank, pid=os.getpid(), backend=ctx.backend, device=device, torch=torch.__version__,
                        triton=triton.__version__, interpreter=os.environ.get("TRITON_INTERPRET") == "1",
                        heap_bytes=ctx.heap.size, shares_gpu=len(_ranks) > 1))
    return out


def progress_path(heap_folder, first_rank):
    """The file an engine touches whenever it reports progress: a second channel, in the cluster's private
    folder, which the client reads before it calls a rank that it has not heard from dead."""
    return os.path.join(heap_folder, f"progress-rank{first_rank}")


_progress_file = None


def _publish(data):
    if _progress_file:
        with contextlib.suppress(OSError):
            with open(_progress_file, "a"):
                os.utime(_progress_file)
    try:
        from ipyparallel.datapub import publish_data

        publish_data(data)
    except Exception:  # not inside an engine (a plain process in a test): no progress channel
        pass


def check_all(fused):
    """``check()`` every hosted rank's launch; their expired waits together in one DeadlockError (the first
    rank's alone would hide the others')."""
    waits = []
    for f in fused:
        try:
            f.check()
        except DeadlockError as e:
            waits += e.waits
    if waits:
        raise DeadlockError(waits)


def errors_as_results(fn):
    """Bad input and deadlocks travel back as RankFailure, so the client can raise one error that combines
    every rank's view (other exceptions are bugs and travel as remote tracebacks)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UsageError, DeadlockError) as e:
            return [RankFailure(c.rank, e) for c in _ranks]
        except Exception as e:
            cause = gemmar_cause(e)   # raised inside a kernel (the sanitizer's bounds checks): wrapped by Triton
            if not isinstance(cause, (UsageError, DeadlockError)):
                raise
            return [RankFailure(c.rank, cause) for c in _ranks]

    # ipyparallel ships a function's code and runs it in the globals of its __module__ on the engine:
    # the wrapper's code needs this module's (functools.wraps copied the wrapped function's module).
    wrapper.__module__ = __name__
    return wrapper


@errors_as_results
def run_gemm_all_reduce(config, inputs=None, reference=None, scale=None, return_c=False, validate=True, parts=None,
                        algorithm=None):
    """Run ``iterations`` back-to-back launches on this engine's ranks; check C after each one.

    ``inputs`` is one (A_r, B_r) per hosted rank, ``scale`` the global inputs' ``input_scale`` (for the
    tolerance); without inputs they come from ``config.seed``
    (every rank builds the same global matrices and keeps its own K-slice), so a benchmark ships no data
    between client and engines. All hosted ranks launch before any of them is waited for.

    ``config``: checked by the client, used as it is. ``parts``: the functions that take the place of the
    kernel's own (a teaching mistake's, a participant's), as shipped (``runtime/shipping.py``); an error raised
    while a participant's parts compile or run comes back as a one-line UsageError that points into their code.
    ``algorithm``: a user's algorithm as shipped (``runtime/shipping.py``), defined here before it runs.
    """
    unship(algorithm)
    try:
        return _run_gemm_all_reduce(config, inputs, reference, scale, return_c, validate, load_parts(parts))
    except (UsageError, DeadlockError):
        raise
    except Exception as e:  # noqa: BLE001 - with parts, the participant's code failed, not gemmar: say where
        yours = {name: shipped for name, shipped in (parts or {}).items() if not gemmars_own(shipped)}
        if not yours:
            raise
        # (still a HeapBoundsError when the sanitizer stopped it: the client then starts fresh ranks)
        kind = HeapBoundsError if isinstance(gemmar_cause(e), HeapBoundsError) else UsageError
        raise kind(failure_text(e, yours)) from None


@dataclasses.dataclass
class RankRun:
    """One hosted rank's part of a run: its launcher, inputs and reference, and what its launches gave."""

    ctx: RankContext
    fused: FusedGemmAllReduce
    A: torch.Tensor
    B: torch.Tensor
    reference: torch.Tensor = None     # None: not checked
    diffs: list = dataclasses.field(default_factory=list)    # max |C - reference| per launch
    events: list = dataclasses.field(default_factory=list)   # trace rows per launch
    dropped: int = 0                   # trace events that did not fit (0 unless the room was sized wrong)
    C: torch.Tensor = None             # the last launch's C

    def record(self, C, iteration, traced, scale=1.0):
        """Check launch ``iteration``'s C against the reference (times ``scale``, what this launch's A was
        multiplied by), and keep its trace rows."""
        ref = self.reference
        self.diffs.append(float((C.to(ref.dtype) - scale * ref).abs().max()) / abs(scale) if ref is not None
                          else None)
        self.C = C
        if traced:
            rows, lost = self.fused.events(iteration)
            self.events.append(rows)
            self.dropped += lost


def _run_gemm_all_reduce(config, inputs, reference, scale, return_c, validate, parts):
    group = local_ranks()
    device = group[0].heap.device   # the hosted ranks share it
    if inputs is None:
        A_all, B_all, reference, scale = seeded_problem(config, device)
    elif reference is not None:
        reference = reference.to(device)
    with contextlib.ExitStack() as scopes:
        runs = []
        for i, ctx in enumerate(group):
            fused = FusedGemmAllReduce(scopes.enter_context(ctx.heap.scope()), config, parts)
            if inputs is None:
                A, B = rank_slice(A_all, B_all, config, ctx.rank, device)
            else:
                A, B = inputs[i][0].to(device), inputs[i][1].to(device)
                fused.check_inputs(A, B)
            runs.append(RankRun(ctx, fused, A, B, reference if validate else None))
        heaps = [ctx.heap for ctx in group]
        for run in runs:   # compile and load everything before any rank's kernel can spin
            run.fused.prepare(run.A, run.B)
        records = scopes.enter_context(sanitizer.recording(heaps[0], config.sanitize))
        _publish({"prepared": True})   # the client's per-launch deadline counts from here (not the compile)
        # Start together. The device clock as each rank leaves the barrier is its trace's time zero; traced
        # iterations start with a barrier each, and its exit times align that iteration (runtime/results.py).
        # Each launch multiplies A by another power of two (problem.CHECK_SCALES): a stale C is caught.
        bases = [run.A.clone() for run in runs] if config.iterations > 1 and validate else None
        exits = [barrier_all(heaps, config.timeout_s)]
        seconds = []
        for it in range(config.iterations):
            times = scale_inputs([run.A for run in runs], bases, it, config.iterations, heaps)
            if config.trace and it > 0:
                # Checking C and copying events out takes host time that differs per rank; without
                # this the next iteration's trace would show a rank waiting for a late peer.
                exits.append(barrier_all(heaps, config.timeout_s))
            t0 = time.perf_counter()
            outs = launch_ranks([run.fused for run in runs], [(run.A, run.B) for run in runs])
            check_all([run.fused for run in runs])
            seconds.append(time.perf_counter() - t0)
            for run, C in zip(runs, outs):
                run.record(C, it, config.trace, times)
            _publish({run.ctx.rank: dict(iteration=it + 1, max_abs_diff=run.diffs[-1], seconds=seconds[-1])
                      for run in runs})
        checked = validate and reference is not None and reference.numel()
        allowed = tolerance(config, scale, float(reference.abs().max()) if checked else 0.0,
                            interpreted=device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
        results = []
        for i, run in enumerate(runs):
            out = RankResult(run.ctx.rank, run.diffs, seconds, allowed, exits[0][i], run.dropped,
                             kernels=run.fused.kernel_resources, iteration_starts_ns=[e[i] for e in exits])
            if run.events:
                out.events = np.concatenate(run.events)
            if return_c:
                out.C = run.C.detach().to("cpu", copy=True)
            results.append(out)
    if records:   # (complete once the recording scope has ended)
        results[0].sanitizer = records[0]
    return results
