"""Host time of one fused launch (what makes ranks that share a GPU start hundreds of us apart), in this
process, with no engines: the ranks of one GPU in one process, as an engine hosts them.

    python3 benchmarks/launch_cost.py [--world_size 2] [--algorithm two_shot] [--profile]

Per launch: the host time of ``FusedGemmAllReduce.__call__(wait=False)`` for each rank in turn (median of
50); the host time of ``launch_ranks`` for all ranks (every rank's first kernel, then every rank's second:
how the runs launch ranks that share a GPU; how far apart the ranks then start is in the traces of
``two_shot_tail.py``); and with ``--profile`` where it goes (cProfile, the top entries).
"""

import argparse
import cProfile
import pstats
import time

import numpy as np
import torch

import gemmar
from gemmar.tuning import tuned_defaults
from gemmar.runtime import rank as rank_runtime
from gemmar.runtime.backends import gpu_properties
from gemmar.runtime.heap.cpu import make_heap_folder, remove_arenas
from gemmar.runtime.launch import FusedGemmAllReduce, launch_ranks


def main(W, algorithm, profile, heap_folder, m=8192, n=8192, k_per_rank=4096, launches=50):
    # (a private folder that exists: at one rank the heap's rendezvous file goes there, and torch's FileStore
    # waited without end for one in a folder that did not)
    rank_runtime.init_ranks(list(range(W)), W, "cuda", 1 << 30, heap_folder, 30.0)
    _, capability, sms = gpu_properties("cuda")
    knobs = tuned_defaults("cuda", algorithm, capability, sms // W)
    config = gemmar.RunConfig(m=m, n=n, k=k_per_rank * W, datatype="bf16", algorithm=algorithm, world_size=W,
                              **knobs)
    ranks = rank_runtime.local_ranks()
    fused = [FusedGemmAllReduce(c.heap, config) for c in ranks]
    A = [torch.randn(m, k_per_rank, device="cuda", dtype=torch.bfloat16) for _ in ranks]
    B = [torch.randn(k_per_rank, n, device="cuda", dtype=torch.bfloat16) for _ in ranks]
    for f, a, b in zip(fused, A, B):
        f.prepare(a, b)
    per_rank = np.zeros((launches, W))
    profiler = cProfile.Profile()
    for i in range(launches + 25):
        torch.cuda.synchronize()
        if profile and i == launches + 5:   # profiled launches are not timed: the profiler slows them
            profiler.enable()
        for r, (f, a, b) in enumerate(zip(fused, A, B)):
            t = time.perf_counter()
            f(a, b, wait=False)
            if 5 <= i < launches + 5:
                per_rank[i - 5, r] = time.perf_counter() - t
        for f in fused:
            f.check()
    profiler.disable()
    together = []
    for i in range(launches + 5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        launch_ranks(fused, list(zip(A, B)))
        if i >= 5:
            together.append(time.perf_counter() - t)
        for f in fused:
            f.check()
    med = np.median(per_rank, axis=0) * 1e6
    print(f"[launch] {algorithm} W={W} ({config.num_sms} + {config.comm_sms} programs): host time per launch "
          f"by rank {', '.join(f'{x:.0f}' for x in med)} us (median of {launches}); "
          f"{sum(p.launcher is not None for f in fused for p in f.prepared[1])} kernels launched directly", flush=True)
    print(f"[launch] {algorithm} W={W}, kernel by kernel (launch_ranks): all ranks {np.median(together) * 1e6:.0f} us "
          f"(median of {launches})", flush=True)
    if profile:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--algorithm", default="two_shot")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    folder = make_heap_folder()
    try:
        main(args.world_size, args.algorithm, args.profile, folder)
    finally:
        remove_arenas(folder)
