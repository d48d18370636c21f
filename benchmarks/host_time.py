"""Host time of one launch at few rows, in this process (world size 1): two_shot at 16 x 8192 x 1024 with its
few-rows tile (and, since 2026-12-04 noon, plain pointers rather than tensor descriptors: launch.gemm_operands),
and the standalone all-reduce of 1 MiB already on the heap, replayed as a CUDA graph and (to compare) through
Triton's launcher. The GPU is held by a sleep kernel while the host enqueues, so the figure is the host's alone; then where it goes (cProfile, top entries).

    python3 benchmarks/host_time.py [--profile] [--rounds 3]
"""

import argparse
import cProfile
import pstats
import time

import torch

import gemmar
from gemmar.runtime import compiled_launch
from gemmar.runtime import rank as rank_runtime
from gemmar.runtime.allreduce import SymmetricAllReduce
from gemmar.runtime.heap.cpu import make_heap_folder, remove_arenas
from gemmar.runtime.launch import FusedGemmAllReduce

LAUNCHES = 500   # (fewer than the GPU queue holds: a full queue makes the host wait for the GPU)


def host_us(fn, profile):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))   # ~1 s of GPU time: every launch below is enqueued while it runs
    t = time.perf_counter()
    for _ in range(LAUNCHES):
        fn()
    spent = (time.perf_counter() - t) / LAUNCHES * 1e6
    torch.cuda.synchronize()
    if profile:
        torch.cuda._sleep(int(2e9))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(LAUNCHES):
            fn()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return spent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="where the last round's time goes (cProfile)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = make_heap_folder()
    try:
        rank_runtime.init_ranks([0], 1, "cuda", 2 << 30, folder, 30.0)
        heap = rank_runtime.local_ranks()[0].heap
        m, n, k = 16, 8192, 1024
        A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        config = gemmar.RunConfig(m=m, n=n, k=k, datatype="bf16", algorithm="two_shot", world_size=1, BLK_M=16,
                                  BLK_N=64, BLK_K=128, num_warps=4, num_stages=4, gsize_m=8, num_sms=132,
                                  comm_sms=132)
        fused = FusedGemmAllReduce(heap, config)
        fused.prepare(A, B)
        C = A @ B
        op = SymmetricAllReduce(heap, 1 << 19, torch.bfloat16)
        op.prepare()
        # Rounds alternate the three loops: a host's speed drifts within a minute (the same torch.matmul loop
        # measured 18.0 and 12.4 us a launch minutes apart), so each ratio compares neighbours in time.
        for round_ in range(args.rounds):
            profile = args.profile and round_ == args.rounds - 1
            fused_us = host_us(lambda: fused(A, B, wait=False), profile)
            matmul_us = host_us(lambda: torch.matmul(A, B, out=C), False)
            compiled_launch.USE_GRAPHS = True
            reduce_us = host_us(lambda: op(op.input, wait=False), profile)
            compiled_launch.USE_GRAPHS = False
            ungraphed_us = host_us(lambda: op(op.input, wait=False), False)
            print(f"round {round_ + 1}: two_shot {m} x {n} x {k}: host {fused_us:.1f} us a launch; torch.matmul "
                  f"{matmul_us:.1f} us ({fused_us / matmul_us:.2f}x); all-reduce 1 MiB on the heap: host "
                  f"{reduce_us:.1f} us a launch (a CUDA graph; {ungraphed_us:.1f} through Triton's launcher)", flush=True)
    finally:
        remove_arenas(folder)


if __name__ == "__main__":
    main()
