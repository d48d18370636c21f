"""What runs inside each engine: one rank's heap, inputs, launches and checks.

The client (``gemmar.Cluster``) calls these functions on every engine at the same time. Each engine keeps
one :class:`RankContext` for its lifetime. Results travel back as :class:`RankResult`; errors that the user
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

from ..config import k_bounds
from ..errors import DeadlockError, GemmarError, UsageError
from .heap import barrier_all, create_heap
from .allreduce import SymmetricAllReduce
from .launch import FusedGemmAllReduce
from .parts import failure_text, load_parts
from .shipping import unship
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


def current():
    """This engine's rank, when it hosts exactly one (code that handles several uses local_ranks())."""
    ranks = local_ranks()
    if len(ranks) != 1:
        raise RuntimeError(f"this engine hosts ranks {[c.rank for c in ranks]}: use local_ranks()")
    return ranks[0]


def watch_owner(owner_pid, owner_started, sessions, patterns, trees, every_s=0.5):
    """The second line of defence: a thread in this engine that ends the whole cluster (reaper.end_cluster)
    and this process when the process that owns the cluster is gone, should the reaper be gone too."""
    import psutil

    from .reaper import end_cluster

    def owner_alive():
        try:
            owner = psutil.Process(owner_pid)
            return owner.create_time() == owner_started and owner.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def watch():
        while owner_alive():
            time.sleep(every_s)
        end_cluster(set(sessions), patterns, trees)
        os._exit(1)

    threading.Thread(target=watch, name="gemmar-owner-watch", daemon=True).start()


def init_ranks(ranks, world_size, backend, heap_size, cluster_id, timeout_s, start_timeout_s=None):
    """Make this engine host ``ranks``: pin the device, build each rank's heap, meet the other ranks.

    One rank per engine on cpu and on cuda with a GPU per rank; every rank in this engine when several
    ranks share GPU 0 (each on its own stream, see ``heap/cuda.py``).
    """
    try:
        # Meeting the other ranks may take as long as starting them; the waits of runs get timeout_s.
        return _init_ranks(ranks, world_size, backend, heap_size, cluster_id, timeout_s,
                           max(timeout_s, start_timeout_s or 0))
    except GemmarError as e:   # travels back as one line, not as a remote traceback
        return [RankFailure(r, e) for r in ranks]


def _init_ranks(ranks, world_size, backend, heap_size, cluster_id, timeout_s, meet_timeout_s):
    global _ranks
    torch.set_num_threads(1)   # ranks share the machine's cores; one thread each is fastest
    if backend == "cuda" and len(ranks) > 1:
        from .heap.cuda import CudaHeap

        heaps = CudaHeap.create_shared(world_size, heap_size, meet_timeout_s)
        barrier_all(heaps, meet_timeout_s)
    else:
        (rank,) = ranks
        if backend == "cuda":
            torch.cuda.set_device(rank)
        heaps = {rank: create_heap(backend, rank, world_size, heap_size, cluster_id, meet_timeout_s)}
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


def seeded_problem(config, device):
    """The global A (M x K) and B (K x N) that ``config.seed`` stands for (the same on every rank), the
    reference C and the inputs' ``input_scale``: built once per engine, however many ranks it hosts.

    On a GPU the reference and the scale are fp32 products there (tf32 off): fast, and far more precise than
    the tolerance; on cpu the reference is fp64."""
    gen = torch.Generator().manual_seed(config.seed)
    A = torch.randn(config.m, config.k, generator=gen).to(config.torch_dtype)
    B = torch.randn(config.k, config.n, generator=gen).to(config.torch_dtype)
    if device.type == "cuda":
        A_full, B_full = A.to(device, torch.float32), B.to(device, torch.float32)
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        reference, scale = A_full @ B_full, input_scale(A_full, B_full)
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        del A_full, B_full
    else:
        reference, scale = A.double() @ B.double(), input_scale(A, B)
    return A, B, reference, scale


def rank_slice(A, B, config, rank, device):
    """Rank ``rank``'s K-slice of the global A and B, on ``device``."""
    start, end = k_bounds(config.k, config.world_size, rank)
    return A[:, start:end].contiguous().to(device), B[start:end, :].contiguous().to(device)


EPSILON = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 0.0}


def tolerance(config, scale=1.0, peak=None, c_dtype=None, wire_dtype=None):
    """Allowed max |C - reference|, for inputs whose products |a| |b| average ``scale`` and a reference
    whose largest |value| is ``peak``.

    fp32 accumulation error grows with K (fp32 inputs use ieee dots); rounding C to its dtype costs half
    an ulp of C; rounding each rank's partial to the wire dtype (an algorithm whose partials travel in a
    dtype of their own) costs that again per rank. Scaling by the inputs' magnitude keeps a correct result
    with large inputs from being rejected. ``c_dtype`` and ``wire_dtype`` default to the config's.
    """
    base = (1e-3 * max(1.0, config.k ** 0.5) + 1e-4 * config.world_size) * max(scale, 1e-30)
    rounding = rounding_error(c_dtype or config.c_dtype)
    wire_dtype = wire_dtype or (config.partial_dtype if config.spec.wire_dtype else None)
    if wire_dtype is not None:
        rounding += config.world_size * rounding_error(wire_dtype)
    return base + rounding * (peak if peak is not None else 0.0)


def rounding_error(dtype):
    """The largest relative error of converting an fp32 value to ``dtype``: half an ulp when the conversion
    rounds to nearest (compiled kernels), a whole ulp under the Triton interpreter, whose conversion to
    bf16 and fp16 truncates (a correct two_shot run with fp32 partials and a bf16 C was called FAILED)."""
    return EPSILON[dtype] * (2 if os.environ.get("TRITON_INTERPRET") == "1" else 1)


def input_scale(A, B):
    """The largest mean |a| |b| over K of any element of C: sum_k |a_ik| |b_kj| / K, at most. About 0.64 for
    unit normals; it grows with the inputs' magnitude, and so does the tolerance."""
    if A.numel() == 0 or B.numel() == 0:
        return 1.0
    return float((A.abs().float() @ B.abs().float()).max()) / A.shape[1]


def _publish(data):
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


def _errors_as_results(fn):
    """Bad input and deadlocks travel back as RankFailure, so the client can raise one error that combines
    every rank's view (other exceptions are bugs and travel as remote tracebacks)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UsageError, DeadlockError) as e:
            return [RankFailure(c.rank, e) for c in _ranks]

    return wrapper


@_errors_as_results
def run_gemm_all_reduce(config, inputs=None, reference=None, scale=None, mistake="none", return_c=False,
                        validate=True, parts=None, algorithm=None):
    """Run ``iterations`` back-to-back launches on this engine's ranks; check C after each one.

    ``inputs`` is one (A_r, B_r) per hosted rank, ``scale`` the global inputs' ``input_scale`` (for the
    tolerance); without inputs they come from ``config.seed``
    (every rank builds the same global matrices and keeps its own K-slice), so a benchmark ships no data
    between client and engines. All hosted ranks launch before any of them is waited for.

    ``parts``: a participant's kernel parts as source (``runtime/parts.py``); an error raised while they
    compile or run comes back as a one-line UsageError that points into their code. ``algorithm``: a
    user's algorithm as shipped (``runtime/shipping.py``), defined here before the config is checked.
    """
    unship(algorithm)
    config = config.validate()
    try:
        return _run_gemm_all_reduce(config, inputs, reference, scale, mistake, return_c, validate,
                                    load_parts(parts))
    except (UsageError, DeadlockError):
        raise
    except Exception as e:  # noqa: BLE001 - with parts, the participant's code failed, not gemmar: say where
        if not parts:
            raise
        raise UsageError(failure_text(e, parts)) from None


def _run_gemm_all_reduce(config, inputs, reference, scale, mistake, return_c, validate, parts):
    group = local_ranks()
    device = group[0].heap.device   # the hosted ranks share it
    if inputs is None:
        A_all, B_all, reference, scale = seeded_problem(config, device)
    elif reference is not None:
        reference = reference.to(device)
    with contextlib.ExitStack() as scopes:
        runs = []
        for i, ctx in enumerate(group):
            heap = scopes.enter_context(ctx.heap.scope())
            fused = FusedGemmAllReduce(heap, config, mistake, parts)
            if inputs is None:
                A, B = rank_slice(A_all, B_all, config, ctx.rank, device)
            else:
                A, B = inputs[i][0].to(device), inputs[i][1].to(device)
                fused.check_inputs(A, B)
            runs.append(dict(ctx=ctx, fused=fused, A=A, B=B, reference=reference if validate else None, diffs=[],
                             events=[], dropped=0))
        heaps = [ctx.heap for ctx in group]
        for run in runs:   # compile and load everything before any rank's kernel can spin
            run["fused"].prepare(run["A"], run["B"])
        _publish({"prepared": True})   # the client's per-launch deadline counts from here (not the compile)
        # Start together. The device clock as each rank leaves the barrier is its trace's time zero; traced
        # iterations start with a barrier each, and its exit times align that iteration (runtime/results.py).
        exits = [barrier_all(heaps, config.timeout_s)]
        seconds = []
        for it in range(config.iterations):
            if config.trace and it > 0:
                # Checking C and copying events out takes host time that differs per rank; without
                # this the next iteration's trace would show a rank waiting for a late peer.
                exits.append(barrier_all(heaps, config.timeout_s))
            t0 = time.perf_counter()
            outs = [run["fused"](run["A"], run["B"], wait=False) for run in runs]
            check_all([run["fused"] for run in runs])
            seconds.append(time.perf_counter() - t0)
            for run, C in zip(runs, outs):
                ref = run["reference"]
                diff = float((C.to(ref.dtype) - ref).abs().max()) if ref is not None else None
                run["diffs"].append(diff)
                run["C"] = C
                if config.trace:
                    rows, lost = run["fused"].events(it)
                    run["events"].append(rows)
                    run["dropped"] += lost
            _publish({run["ctx"].rank: dict(iteration=it + 1, max_abs_diff=run["diffs"][-1], seconds=seconds[-1])
                      for run in runs})
        checked = validate and reference is not None and reference.numel()
        allowed = tolerance(config, scale, float(reference.abs().max()) if checked else 0.0)
        results = []
        for i, run in enumerate(runs):
            out = RankResult(run["ctx"].rank, run["diffs"], seconds, allowed, exits[0][i], run["dropped"],
                             kernels=run["fused"].kernel_resources, iteration_starts_ns=[e[i] for e in exits])
            if run["events"]:
                out.events = np.concatenate(run["events"])
            if return_c:
                out.C = run["C"].detach().to("cpu", copy=True)
            results.append(out)
        return results


def _median_ms(fn, reps, streams=(), one_process=False, trials=5):
    """Median over ``trials`` of the mean time of ``reps`` back-to-back calls, all ranks starting together
    (ranks in separate processes meet at a torch.distributed barrier first). The events are on the default
    stream; ``streams`` (the ranks' own, where their kernels run) start after the first event and must
    finish before the last."""
    times = []
    for _ in range(trials):
        if not one_process:
            import torch.distributed as dist

            dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for stream in streams:
            stream.wait_event(start)
        for _ in range(reps):
            fn()
        for stream in streams:
            done = torch.cuda.Event()
            done.record(stream)
            torch.cuda.current_stream().wait_event(done)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return float(np.median(times))


@_errors_as_results
def benchmark_rank(configs, reps=20, warmup=5, baseline=True, problem=None):
    """GPU timing on this engine's ranks, all in one run: each fused kernel (``configs`` maps an algorithm
    to its RunConfig; validated before and after timing), then torch.matmul of the same per-rank shapes,
    the NCCL all-reduce of C, and the two in sequence. One dict per hosted rank."""
    group = local_ranks()
    heaps = [ctx.heap for ctx in group]
    shared = len(group) > 1
    if heaps[0].device.type != "cuda":
        raise UsageError("timing against cuBLAS + NCCL needs the cuda backend")
    if baseline and shared:
        raise UsageError("the cuBLAS + NCCL baseline needs one GPU per rank; these ranks share a GPU "
                         "(time the fused kernels alone, without --baseline)")
    configs = {alg: config.validate() for alg, config in configs.items()}
    base = problem.validate() if problem is not None else next(iter(configs.values()))
    A_all, B_all, reference, scale = seeded_problem(base, heaps[0].device)
    inputs = [(*rank_slice(A_all, B_all, base, ctx.rank, ctx.heap.device), reference) for ctx in group]
    del A_all, B_all
    peak = float(reference.abs().max())
    outs = [dict(rank=ctx.rank, fused_ms={}, max_abs_diff={}, tolerance={}) for ctx in group]
    for algorithm, config in configs.items():
        with contextlib.ExitStack() as scopes:
            fused = [FusedGemmAllReduce(scopes.enter_context(h.scope()), config) for h in heaps]

            def launch_all():
                return [f(A, B, wait=False) for f, (A, B, _) in zip(fused, inputs)]

            def checked_diffs():
                Cs = launch_all()
                check_all(fused)
                return [float((C.float() - ref).abs().max()) for C, (_, _, ref) in zip(Cs, inputs)]

            for f, (A, B, _) in zip(fused, inputs):
                f.prepare(A, B)
            barrier_all(heaps)
            diffs = [checked_diffs() for _ in range(2)]
            for _ in range(warmup):
                launch_all()
            ms = _median_ms(launch_all, reps, [h.stream for h in heaps], one_process=shared)
            check_all(fused)
            diffs.append(checked_diffs())  # still right after timing
            for i, out in enumerate(outs):
                out["fused_ms"][algorithm] = ms
                out["max_abs_diff"][algorithm] = max(d[i] for d in diffs)
                out["tolerance"][algorithm] = tolerance(config, scale, peak)
            barrier_all(heaps)
    if baseline:
        import torch.distributed as dist

        (A, B, _), out = inputs[0], outs[0]
        C = A @ B
        for _ in range(warmup):
            torch.matmul(A, B, out=C)
            dist.all_reduce(C)
        out["matmul_ms"] = _median_ms(lambda: torch.matmul(A, B, out=C), reps)
        out["allreduce_ms"] = _median_ms(lambda: dist.all_reduce(C), reps)
        out["sequential_ms"] = _median_ms(lambda: (torch.matmul(A, B, out=C), dist.all_reduce(C)), reps)
        out.update(_best_overlap(A, B, C, inputs[0][2], reps, warmup))
        # cuBLAS returns C in the input dtype, and NCCL sums the ranks' Cs in it.
        out["overlap_tolerance"] = tolerance(base, scale, peak, c_dtype=base.torch_dtype, wire_dtype=base.torch_dtype)
    return outs


OVERLAP_CHUNKS = (2, 4, 8)


def overlapped_matmul_all_reduce(A, B, C, chunks, side):
    """cuBLAS + NCCL the way a user would overlap them: C's rows in ``chunks`` blocks; the matmul of block
    i + 1 runs on the current stream while NCCL all-reduces block i, issued from the ``side`` stream."""
    import torch.distributed as dist

    main = torch.cuda.current_stream()
    for a, c in zip(A.chunk(chunks), C.chunk(chunks)):
        torch.matmul(a, B, out=c)
        side.wait_stream(main)  # block i is computed before NCCL reads it
        with torch.cuda.stream(side):
            dist.all_reduce(c)
    main.wait_stream(side)


def _best_overlap(A, B, C, reference, reps, warmup):
    """The chunked overlap at each chunk count that M allows; the fastest one is the bar to beat. Its C is
    checked against the reference, so a fast but wrong baseline would show."""
    side = torch.cuda.Stream()
    best = None
    for chunks in (c for c in OVERLAP_CHUNKS if c <= A.shape[0]):
        for _ in range(warmup):
            overlapped_matmul_all_reduce(A, B, C, chunks, side)
        ms = _median_ms(lambda: overlapped_matmul_all_reduce(A, B, C, chunks, side), reps)
        if best is None or ms < best[0]:
            best = (ms, chunks)
    C.zero_()
    overlapped_matmul_all_reduce(A, B, C, best[1], side)
    return dict(overlap_ms=best[0], overlap_chunks=best[1],
                overlap_max_abs_diff=float((C.float() - reference).abs().max()))


def all_reduce_input(numel, dtype, seed, rank, device):
    """Rank ``rank``'s values for the all-reduce benchmark: the same on every engine that builds them."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    return torch.randn(numel, generator=gen).to(dtype).to(device)


@_errors_as_results
def run_all_reduce(numel, datatype, comm_sms, iterations, seed=0, timeout_s=60.0, reps=0, baseline=False,
                   scheme="two_shot"):
    """The standalone all-reduce on this engine's ranks: ``iterations`` checked launches (every rank's
    result against the float64 sum of every rank's input; a digest of its bits, to compare across ranks);
    on GPUs, with ``reps``, the median time of back-to-back launches, and with ``baseline`` NCCL's
    all_reduce of the same values (and torch's symmetric-memory two-shot all-reduce where there is one)."""
    import hashlib

    from ..config import DTYPES, dtype_name

    dtype = DTYPES[dtype_name(datatype)]
    group = local_ranks()
    heaps = [ctx.heap for ctx in group]
    device, W = heaps[0].device, heaps[0].world_size
    timed = bool(reps) and device.type == "cuda"
    if timed and baseline and len(group) > 1:   # refused before any work, not after it
        raise UsageError("the NCCL baseline needs one GPU per rank; these ranks share a GPU")
    reference = sum(all_reduce_input(numel, dtype, seed, r, "cpu").double() for r in range(W))
    # One ulp of the result's dtype at the largest value (Triton's interpreter rounds toward zero), and
    # fp32 summation of W values.
    peak = float(reference.abs().max())
    allowed = 2 * EPSILON[dtype] * peak + 1e-6 * W * peak
    inputs = [all_reduce_input(numel, dtype, seed, ctx.rank, device) for ctx in group]
    outs = [dict(rank=ctx.rank, max_abs_diff=[], tolerance=allowed, digest=None) for ctx in group]
    with contextlib.ExitStack() as scopes:
        ops = [SymmetricAllReduce(scopes.enter_context(h.scope()), numel, dtype, comm_sms, timeout_s, scheme)
               for h in heaps]
        for op in ops:
            op.prepare()
        barrier_all(heaps, timeout_s)

        def launch_all():
            return [op(x, wait=False) for op, x in zip(ops, inputs)]

        for _ in range(iterations):
            results = launch_all()
            check_all(ops)
            for out, result in zip(outs, results):
                out["max_abs_diff"].append(float((result.double().cpu() - reference).abs().max()))
                raw = result.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                out["digest"] = hashlib.sha1(raw.numpy().tobytes()).hexdigest()   # the bits, to compare ranks
        if timed:
            for _ in range(3):
                launch_all()
            ms = _median_ms(launch_all, reps, [h.stream for h in heaps], one_process=len(group) > 1)
            check_all(ops)
            for out in outs:
                out["gemmar_ms"] = ms
        barrier_all(heaps, timeout_s)
    if timed and baseline:
        import torch.distributed as dist

        y = inputs[0].clone()
        outs[0]["nccl_ms"] = _median_ms(lambda: dist.all_reduce(y), reps)
        outs[0].update(_symm_mem_two_shot_ms(inputs[0], reps))
    return outs


def _symm_mem_two_shot_ms(x, reps):
    """torch's own symmetric-memory two-shot all-reduce of the same values, where this torch has one."""
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        buffer = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(buffer, dist.group.WORLD.group_name)
        buffer.copy_(x)
        op = torch.ops.symm_mem.two_shot_all_reduce_
        return {"torch_symm_mem_ms": _median_ms(lambda: op(buffer, "sum", dist.group.WORLD.group_name), reps)}
    except Exception as e:  # noqa: BLE001 - not in this torch, or not for this dtype: reported, not raised
        return {"torch_symm_mem_error": f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"}
