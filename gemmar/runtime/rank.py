"""What runs inside each engine: one rank's heap, inputs, launches and checks.

The client (``gemmar.Cluster``) calls these functions on every engine at the same time. Each engine keeps
one :class:`RankContext` for its lifetime. Results travel back as :class:`RankResult`; errors that the user
must see (bad input, a deadlock) travel back as :class:`RankFailure`, so the client can raise one exception
with every rank's view.
"""

import functools
import os
import platform
import time

import numpy as np
import torch

from ..config import k_bounds
from ..errors import DeadlockError, UsageError
from .heap import create_heap
from .launch import FusedGemmAllReduce
from .results import RankFailure, RankResult

_context = None


class RankContext:
    def __init__(self, rank, world_size, backend, heap):
        self.rank, self.world_size, self.backend, self.heap = rank, world_size, backend, heap


def current():
    if _context is None:
        raise RuntimeError("this process is not a gemmar rank: start it through gemmar.Cluster")
    return _context


def init_rank(rank, world_size, backend, heap_size, cluster_id, timeout_s):
    """Make this engine rank ``rank``: pin its device, build its heap, meet the other ranks."""
    global _context
    torch.set_num_threads(1)   # ranks share the machine's cores; one thread each is fastest
    if backend == "cuda":
        torch.cuda.set_device(rank)
    heap = create_heap(backend, rank, world_size, heap_size, cluster_id, timeout_s)
    _context = RankContext(rank, world_size, backend, heap)
    return describe()


def describe():
    import triton

    ctx = current()
    device = torch.cuda.get_device_name(ctx.rank) if ctx.backend == "cuda" else platform.processor() or "cpu"
    return dict(rank=ctx.rank, pid=os.getpid(), backend=ctx.backend, device=device, torch=torch.__version__,
                triton=triton.__version__, interpreter=os.environ.get("TRITON_INTERPRET") == "1",
                heap_bytes=ctx.heap.size)


def seeded_inputs(config, rank, device):
    """This rank's K-slice of the seeded global A (M x K) and B (K x N), and the fp64/fp32 reference C."""
    gen = torch.Generator().manual_seed(config.seed)
    A = torch.randn(config.m, config.k, generator=gen).to(config.torch_dtype)
    B = torch.randn(config.k, config.n, generator=gen).to(config.torch_dtype)
    start, end = k_bounds(config.k, config.world_size, rank)
    A_r = A[:, start:end].contiguous().to(device)
    B_r = B[start:end, :].contiguous().to(device)
    if device.type == "cuda":  # fp32 on the GPU (tf32 off): fast, and far more precise than the tolerance
        A_full, B_full = A.to(device, torch.float32), B.to(device, torch.float32)
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        reference = A_full @ B_full
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        del A_full, B_full
    else:
        reference = A.double() @ B.double()
    return A_r, B_r, reference


def tolerance(config):
    """Allowed max |C - reference|: fp32 accumulation error grows with K (fp32 inputs use ieee dots)."""
    return 1e-3 * max(1.0, config.k ** 0.5) + 1e-4 * config.world_size


def _publish(data):
    try:
        from ipyparallel.datapub import publish_data

        publish_data(data)
    except Exception:  # not inside an engine (a plain process in a test): no progress channel
        pass


def _errors_as_results(fn):
    """Bad input and deadlocks travel back as RankFailure, so the client can raise one error that combines
    every rank's view (other exceptions are bugs and travel as remote tracebacks)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UsageError, DeadlockError) as e:
            return RankFailure(current().rank, e)

    return wrapper


@_errors_as_results
def run_gemm_all_reduce(config, A=None, B=None, reference=None, mistake="none", return_c=False,
                        validate=True):
    """Run ``iterations`` back-to-back launches on this rank; check C after each one.

    Without A and B, the inputs come from ``config.seed`` (every rank builds the same global matrices and
    keeps its own K-slice), so a benchmark ships no data between client and engines.
    """
    ctx = current()
    config = config.validate()
    heap = ctx.heap
    with heap.scope():
        fused = FusedGemmAllReduce(heap, config, mistake)
        if A is None:
            A, B, seeded_reference = seeded_inputs(config, ctx.rank, heap.device)
            reference = seeded_reference if validate else None
        else:
            A, B = A.to(heap.device), B.to(heap.device)
            fused.check_inputs(A, B)
            reference = reference.to(heap.device) if (validate and reference is not None) else None
        # Start together. The device clock as each rank leaves the barrier is its trace's time zero.
        t_zero = heap.barrier(config.timeout_s)
        diffs, seconds, events, dropped = [], [], [], 0
        for it in range(config.iterations):
            if config.trace and it > 0:
                # Checking C and copying events out takes host time that differs per rank; without
                # this the next iteration's trace would show a rank waiting for a late peer.
                heap.barrier(config.timeout_s)
            t0 = time.perf_counter()
            C = fused(A, B)
            heap.synchronize()
            seconds.append(time.perf_counter() - t0)
            diff = float((C.to(reference.dtype) - reference).abs().max()) if reference is not None else None
            diffs.append(diff)
            if config.trace:
                rows, lost = fused.events(it)
                events.append(rows)
                dropped += lost
            _publish(dict(iteration=it + 1, max_abs_diff=diff, seconds=seconds[-1]))
        out = RankResult(ctx.rank, diffs, seconds, tolerance(config), t_zero, dropped)
        if events:
            out.events = np.concatenate(events)
        if return_c:
            out.C = C.detach().to("cpu", copy=True)
        return out


def _median_ms(fn, reps, trials=5):
    """Median over ``trials`` of the mean time of ``reps`` back-to-back calls, all ranks starting together."""
    import torch.distributed as dist

    times = []
    for _ in range(trials):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return float(np.median(times))


@_errors_as_results
def benchmark_rank(configs, reps=20, warmup=5, baseline=True):
    """GPU timing on this rank, all in one process and run: each fused kernel (``config_dicts`` maps an
    algorithm to its settings; validated before and after timing), then torch.matmul of the same per-rank
    shapes, the NCCL all-reduce of C, and the two in sequence."""
    import torch.distributed as dist

    ctx = current()
    heap = ctx.heap
    if heap.device.type != "cuda":
        raise UsageError("timing against cuBLAS + NCCL needs the cuda backend")
    configs = {alg: config.validate() for alg, config in configs.items()}
    base = next(iter(configs.values()))
    A, B, reference = seeded_inputs(base, ctx.rank, heap.device)
    out = dict(rank=ctx.rank, fused_ms={}, max_abs_diff={}, tolerance=tolerance(base))
    for algorithm, config in configs.items():
        with heap.scope():
            fused = FusedGemmAllReduce(heap, config)
            heap.barrier()
            diffs = [float((fused(A, B).float() - reference).abs().max()) for _ in range(2)]
            for _ in range(warmup):
                fused(A, B, wait=False)
            out["fused_ms"][algorithm] = _median_ms(lambda: fused(A, B, wait=False), reps)
            fused.check()
            diffs.append(float((fused(A, B).float() - reference).abs().max()))  # still right after timing
            out["max_abs_diff"][algorithm] = max(diffs)
            heap.barrier()
    if baseline:
        C = A @ B
        for _ in range(warmup):
            torch.matmul(A, B, out=C)
            dist.all_reduce(C)
        out["matmul_ms"] = _median_ms(lambda: torch.matmul(A, B, out=C), reps)
        out["allreduce_ms"] = _median_ms(lambda: dist.all_reduce(C), reps)
        out["sequential_ms"] = _median_ms(lambda: (torch.matmul(A, B, out=C), dist.all_reduce(C)), reps)
    return out
