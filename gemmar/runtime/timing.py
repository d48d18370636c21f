"""GPU timing on the ranks, all in one run: each fused kernel, and the unfused baseline (torch.matmul, NCCL's
all-reduce of C, the two in sequence, and overlapped in row blocks), every kernel validated before and after
timing. Called by the client (``Cluster.compare_to_unfused``) on every engine at once."""

import contextlib
import time

import numpy as np
import torch

from ..errors import UsageError
from .heap import barrier_all
from .launch import FusedGemmAllReduce, launch_ranks
from .problem import rank_slice, seeded_problem, tolerance
from .rank import errors_as_results, check_all, local_ranks


GPU_CLOCK_HZ = 1.98e9   # (a Hopper GPU's top SM clock: torch.cuda._sleep counts cycles, not time)


def one_trial(fn, reps, streams=(), hold_ms=0.0):
    """(GPU milliseconds per call, host seconds spent enqueueing) of ``reps`` back-to-back calls of ``fn``, from
    events on the current stream; ``streams`` (where ``fn`` also enqueues work) start after the first event and
    must finish before the last. ``hold_ms``: the GPU first sleeps this long, so the host is ahead when the calls
    start and its launch time stays out of the GPU's figure (0: a user's loop, the host's time included)."""
    torch.cuda.synchronize()
    if hold_ms:
        torch.cuda._sleep(int(hold_ms * 1e-3 * GPU_CLOCK_HZ))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for stream in streams:
        stream.wait_event(start)
    began = time.perf_counter()
    for _ in range(reps):
        fn()
    host_seconds = time.perf_counter() - began
    for stream in streams:
        done = torch.cuda.Event()
        done.record(stream)
        torch.cuda.current_stream().wait_event(done)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps, host_seconds


def median_ms(fn, reps, streams=(), one_process=False, trials=5):
    """Median over ``trials`` of the mean time of ``reps`` back-to-back calls, all ranks starting together
    (ranks in separate processes meet at a torch.distributed barrier first); see one_trial."""
    times = []
    for _ in range(trials):
        if not one_process:
            import torch.distributed as dist

            dist.barrier()
        times.append(one_trial(fn, reps, streams)[0])
    return float(np.median(times))


@errors_as_results
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
    base = problem if problem is not None else next(iter(configs.values()))
    A_all, B_all, reference, scale = seeded_problem(base, heaps[0].device)
    inputs = [(*rank_slice(A_all, B_all, base, ctx.rank, ctx.heap.device), reference) for ctx in group]
    del A_all, B_all
    peak = float(reference.abs().max())
    outs = [dict(rank=ctx.rank, fused_ms={}, max_abs_diff={}, tolerance={}) for ctx in group]
    for algorithm, config in configs.items():
        with contextlib.ExitStack() as scopes:
            fused = [FusedGemmAllReduce(scopes.enter_context(h.scope()), config) for h in heaps]

            def launch_all():
                return launch_ranks(fused, [(A, B) for A, B, _ in inputs])

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
            ms = median_ms(launch_all, reps, [h.stream for h in heaps], one_process=shared)
            check_all(fused)
            diffs.append(checked_diffs())  # still right after timing
            for i, out in enumerate(outs):
                out["fused_ms"][algorithm] = ms
                out["max_abs_diff"][algorithm] = max(d[i] for d in diffs)
                out["tolerance"][algorithm] = tolerance(config, scale, peak)
            barrier_all(heaps)
    if baseline:
        outs[0].update(_baseline(*inputs[0], base, scale, peak, reps, warmup))
    return outs


def _baseline(A, B, reference, base, scale, peak, reps, warmup):
    """torch.matmul of rank 0's slices, NCCL's all-reduce of C, the two in sequence and overlapped."""
    import torch.distributed as dist

    out = {}
    C = A @ B
    for _ in range(warmup):
        torch.matmul(A, B, out=C)
        dist.all_reduce(C)
    out["matmul_ms"] = median_ms(lambda: torch.matmul(A, B, out=C), reps)
    out["allreduce_ms"] = median_ms(lambda: dist.all_reduce(C), reps)
    out["sequential_ms"] = median_ms(lambda: (torch.matmul(A, B, out=C), dist.all_reduce(C)), reps)
    out.update(_best_overlap(A, B, C, reference, reps, warmup))
    # cuBLAS returns C in the input dtype, and NCCL sums the ranks' Cs in it.
    out["overlap_tolerance"] = tolerance(base, scale, peak, c_dtype=base.torch_dtype, wire_dtype=base.torch_dtype)
    return out


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
        ms = median_ms(lambda: overlapped_matmul_all_reduce(A, B, C, chunks, side), reps)
        if best is None or ms < best[0]:
            best = (ms, chunks)
    C.zero_()
    overlapped_matmul_all_reduce(A, B, C, best[1], side)
    return dict(overlap_ms=best[0], overlap_chunks=best[1],
                overlap_max_abs_diff=float((C.float() - reference).abs().max()))


def symm_mem_ms(x, reps):
    """torch's own symmetric-memory all-reduces of the same values, where this torch has them: two-shot
    (``torch_symm_mem_ms``, in place) and one-shot (``torch_symm_mem_one_shot_ms``); the best of the two is
    the baseline to beat. A scheme this torch (or dtype) lacks is reported as ``..._error``, not raised."""
    figures = {}
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD.group_name
        buffer = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(buffer, group)
        buffer.copy_(x)
    except Exception as e:  # noqa: BLE001 - no symmetric memory in this torch
        return {"torch_symm_mem_error": _one_line(e)}
    for key, op in (("torch_symm_mem", lambda: torch.ops.symm_mem.two_shot_all_reduce_(buffer, "sum", group)),
                    ("torch_symm_mem_one_shot", lambda: torch.ops.symm_mem.one_shot_all_reduce(buffer, "sum", group))):
        try:
            figures[f"{key}_ms"] = median_ms(op, reps)
        except Exception as e:  # noqa: BLE001 - this scheme not in this torch, or not for this dtype
            figures[f"{key}_error"] = _one_line(e)
    return figures


def _one_line(error):
    return f"{type(error).__name__}: {str(error).splitlines()[0][:100] if str(error) else ''}"
