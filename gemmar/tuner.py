"""Timing kernels and tiles at world size 1 on this machine's GPU, in this process: what ``gemmar tune`` and
``benchmarks/shape_sweep.py`` share. One rank, no ipyparallel engine: at world size 1 a fused launch is its GEMM
alone (two_shot and one_shot write each tile straight into C), so the tile that is fastest here is the GEMM
core's best for the shape.

Every setting is checked against torch (``||C - A B|| / ||A B||`` in fp32, its C poisoned with NaN first where
the kernel overwrites it) before it is timed, and again after; a wrong or failing setting is never chosen.
Times are medians of trials of back-to-back launches, two ways (as in benchmarks/inference_sweep.py): ``gpu``
with the host's work hidden (a sleep kernel holds the GPU while the host enqueues every launch) and ``wall`` as a
user's loop sees it (host time included), the latter only where a launch is short enough for the host to matter.
"""

import contextlib

import numpy as np
import torch

from .config import RunConfig
from .tuning_cache import TILE_KNOBS, TILED, candidates, make_entry, rule_tile

TRIALS = 5
TRIAL_MS = 2.0          # back-to-back launches per trial: about this long, 3 to 50 of them
WALL_BELOW_MS = 0.5     # a launch shorter than this is also timed as a user's loop (the host's time can decide)
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3, "fp32": 1e-4}   # relative error of C: the output dtype's rounding and more


@contextlib.contextmanager
def one_gpu_rank(heap_bytes):
    """This process as rank 0 of 1 on GPU 0, with a symmetric heap of ``heap_bytes``; yields the heap."""
    from .runtime import rank as rank_runtime
    from .runtime.heap.cpu import make_heap_folder, remove_arenas

    folder = make_heap_folder()
    try:
        ranks = rank_runtime.init_ranks([0], 1, "cuda", heap_bytes, folder, 30.0)
        if ranks and isinstance(ranks[0], Exception):
            raise ranks[0]
        yield rank_runtime.local_ranks()[0].heap
    finally:
        remove_arenas(folder)


def time_call(fn, est_ms, streams=()):
    """{"gpu_ms", "wall_ms"}: medians over TRIALS trials of back-to-back calls of ``fn``; ``streams``: other
    streams ``fn`` enqueues work on (joined into the timing)."""
    from .runtime.timing import one_trial

    reps = int(min(50, max(3, TRIAL_MS / max(est_ms, 1e-3))))
    out = {}
    for hide_host in (True, False) if est_ms < WALL_BELOW_MS else (True,):
        hold_ms = reps * 0.06 if hide_host else 0.0   # ~60 us a launch: more than a launch's host time
        times = [one_trial(fn, reps, streams, hold_ms)[0] for _ in range(TRIALS)]
        out["gpu_ms" if hide_host else "wall_ms"] = float(np.median(times))
    out.setdefault("wall_ms", out["gpu_ms"])
    return out


def inputs(m, n, k, datatype, seed=0):
    """A (m x k), B (k x n) of ``datatype`` on the GPU, random, and the fp32 reference A B."""
    from .config import DTYPES

    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(m, k, device="cuda", dtype=DTYPES[datatype], generator=g)
    B = torch.randn(k, n, device="cuda", dtype=DTYPES[datatype], generator=g)
    return A, B, A.float() @ B.float()


def relative_error(out, ref):
    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def time_matmul(A, B):
    C = A @ B
    first = time_call(lambda: torch.matmul(A, B, out=C), 1.0)   # (a first figure, to size the trials)
    return time_call(lambda: torch.matmul(A, B, out=C), first["gpu_ms"])


def config_for(m, n, k, datatype, algorithm, knobs):
    return RunConfig(m=m, n=n, k=k, datatype=datatype, algorithm=algorithm, world_size=1, **knobs).validate()


def time_config(heap, config, A, B, ref, est_ms):
    """Check and time one configuration: {"gpu_ms", "wall_ms", "rel_err", "ok", "registers", "spills"} or
    {"error": one line, "ok": False}."""
    from .runtime.launch import FusedGemmAllReduce

    tolerance = TOLERANCE[config.datatype]
    try:
        with heap.scope():
            fused = FusedGemmAllReduce(heap, config)
            fused.prepare(A, B)
            if config.algorithm in TILED:   # (they overwrite C: unwritten elements stay NaN)
                fused.spec.output(fused.buffers, 0).fill_(float("nan"))
            err = relative_error(fused(A, B), ref)
            for _ in range(2):
                fused(A, B, wait=False)
            timing = time_call(lambda: fused(A, B, wait=False), est_ms, [heap.stream, heap.side_stream])
            fused.check()
            err = max(err, relative_error(fused(A, B), ref))
            return dict(timing, rel_err=err, ok=err <= tolerance,
                        registers=[r["registers"] for r in fused.kernel_resources],
                        spills=[r["spills"] for r in fused.kernel_resources])
    except Exception as e:  # noqa: BLE001 - a setting that does not compile or run is a figure too
        torch.cuda.synchronize()
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return dict(ok=False, error=f"{type(e).__name__}: {first}")


def tile_knobs(tile, sms, shape=None, algorithm="two_shot", split_k=None, gemv=False):
    """A tile tuple (TILE_KNOBS order) as RunConfig knobs at world size 1: one program per SM; with the ``shape``
    (M, N, K), the K slices the package would take with that tile (``tuning.split_k_rule``; with ``gemv``, the
    few-rows kernel's, ``tuning.gemv_split``) unless ``split_k`` says how many."""
    from .tuning import gemv_split, split_k_rule

    if split_k is None:
        split_k = 1 if shape is None else gemv_split((*shape, 1), tile[1], tile[2], sms) if gemv else \
            split_k_rule(algorithm, (*shape, 1), tuple(tile[:3]), sms)
    return dict(zip(TILE_KNOBS, tile), num_sms=sms, comm_sms=sms, split_k=split_k, gemv=gemv)


def tune_shape(heap, shape, datatype, gpu, sms, algorithm="two_shot", tiles=None, seed=0, on_tile=None, first=None,
               gemv=None):
    """Time every candidate tile (``first``, the tile the shape gets today, then the rule's and the candidates) at
    ``shape`` (M, N, K_r); return (cache entry or None when none was right, [per-tile figures], torch.matmul's
    figures). ``gemv``: a tile to time first with the few-rows kernel (RunConfig.gemv; ``tuning.gemv_tile``'s),
    a candidate of its own beside the tile GEMM's. ``on_tile(count)``: called after each tile."""
    m, n, k = shape
    A, B, ref = inputs(m, n, k, datatype, seed)
    matmul = time_matmul(A, B)
    tried = []
    if gemv is not None:
        knobs = tile_knobs(gemv, sms, shape, algorithm, gemv=True)
        figures = time_config(heap, config_for(m, n, k, datatype, algorithm, knobs), A, B, ref, matmul["gpu_ms"])
        tried.append(dict(tile=list(gemv), gemv=True, **figures))
        if on_tile:
            on_tile(len(tried))
    ahead = [tuple(t) for t in (first, rule_tile(shape, sms=sms)) if t is not None]
    for tile in dict.fromkeys(ahead + [tuple(t) for t in (tiles or candidates(m))]):
        figures = time_config(heap, config_for(m, n, k, datatype, algorithm, tile_knobs(tile, sms, shape, algorithm)),
                              A, B, ref, matmul["gpu_ms"])
        tried.append(dict(tile=list(tile), **figures))
        if on_tile:
            on_tile(len(tried))
    right = [t for t in tried if t["ok"]]
    del A, B, ref
    if not right:
        return None, tried, matmul
    best = min(right, key=lambda t: t["wall_ms"])
    import triton

    entry = make_entry(gpu, datatype, 1, shape, algorithm, best["tile"], gemv=best.get("gemv", False),
                       ms=round(best["wall_ms"], 5),
                       gpu_ms=round(best["gpu_ms"], 5), matmul_ms=round(matmul["wall_ms"], 5),
                       triton=triton.__version__, torch=torch.__version__)
    return entry, tried, matmul


def heap_bytes_for(shapes, datatype):
    """A heap large enough for any candidate at any of ``shapes`` (C and the partials, with room to spare)."""
    from .config import DTYPES

    itemsize = torch.empty(0, dtype=DTYPES[datatype]).element_size()
    most = max(m * n for m, n, _ in shapes)
    # C, the partials (whole tiles: up to 255 rows and columns of padding each way) and the flags
    padded = max((-(-m // 256) * 256) * (-(-n // 256) * 256) for m, n, _ in shapes)
    return max(256 << 20, int(1.25 * (most + padded) * itemsize) + (64 << 20))
