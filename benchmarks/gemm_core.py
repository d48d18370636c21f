"""The GEMM core alone against torch.matmul (cuBLAS) on one GPU, in one run: the persistent GEMM that every
fused kernel shares (``kernels.gemm``), with TMA tensor descriptors as the launcher gives it on Hopper.

    python3 benchmarks/gemm_core.py OUTDIR

Per-rank shapes M x N x K (bf16 in, fp32 accumulation, bf16 out). For each shape, torch.matmul and each tile
setting below, timed with CUDA events as the median of 5 trials of 20 back-to-back launches after 5 warm-ups
(inputs rotated over 3 sets so that L2 holds none of them); every kernel's C is checked against
torch.matmul before timing. Prints a table; writes OUTDIR/gemm-core.json.
"""

import datetime
import json
import os
import sys

import numpy as np
import torch
import triton

from gemmar.config import RunConfig
from gemmar.kernels.gemm import persistent_gemm
from gemmar.runtime.launch import gemm_operands

SHAPES = [(8192, 8192, 8192), (4096, 8192, 14336), (8192, 8192, 2048)]
# (BLK_M, BLK_N, BLK_K, num_warps, num_stages, TMA, FLATTEN)
SETTINGS = [(128, 256, 64, 8, 3, True, True), (128, 256, 64, 8, 3, True, False), (128, 128, 64, 8, 4, True, True),
            (128, 128, 64, 8, 4, False, False)]


def median_ms(fn, reps=20, trials=5, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return float(np.median(times))


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    report = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), gpu=props.name, sms=sms,
                  torch=torch.__version__, triton=triton.__version__, results=[])
    for m, n, k in SHAPES:
        sets = [(torch.randn(m, k, device="cuda").bfloat16(), torch.randn(k, n, device="cuda").bfloat16())
                for _ in range(3)]
        C = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        turn = [0]

        def cublas():
            A, B = sets[turn[0] % 3]
            turn[0] += 1
            torch.matmul(A, B, out=C)

        row = dict(shape=(m, n, k), matmul_ms=median_ms(cublas), settings=[])
        reference = (sets[0][0] @ sets[0][1]).float()
        for bm, bn, bk, warps, stages, tma, flatten in SETTINGS:
            config = RunConfig(m=m, n=n, k=k, datatype="bf16", BLK_M=bm, BLK_N=bn, BLK_K=bk, gsize_m=8,
                               num_sms=sms, world_size=1, num_warps=warps, num_stages=stages).validate()
            operands = [gemm_operands(A, B, config, C.device) if tma else (A, B, False) for A, B in sets]
            dummy = torch.zeros(1, dtype=torch.int64, device="cuda")

            def fused(i=None):
                A, B, use_tma = operands[turn[0] % 3 if i is None else i]
                turn[0] += 1
                persistent_gemm[(sms,)](A, B, C, m, n, k, k, 1, n, 1, n, 1, dummy, dummy, BLOCK_M=bm, BLOCK_N=bn,
                                        BLOCK_K=bk, GROUP_SIZE_M=8, NUM_SMS=sms, DOT_PRECISION="tf32",
                                        TRACE_CAPACITY=0, EVEN_K=k % bk == 0, TMA=use_tma, FLATTEN=flatten,
                                        num_warps=warps, num_stages=stages)

            try:
                fused(0)
                err = float((C.float() - reference).abs().max() / reference.abs().max())
                ms = median_ms(fused)
            except Exception as e:  # a setting that does not fit (shared memory) is reported, not fatal
                print(f"[gemm-core] {m}x{n}x{k} {bm}x{bn}x{bk} w{warps} s{stages} tma={tma}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:120]}", flush=True)
                continue
            ratio = ms / row["matmul_ms"]
            row["settings"].append(dict(block=(bm, bn, bk), num_warps=warps, num_stages=stages, tma=tma,
                                        flatten=flatten, ms=ms, vs_matmul=ratio, rel_err=err))
            print(f"[gemm-core] {m}x{n}x{k}: torch.matmul {row['matmul_ms']:.3f} ms | persistent_gemm {bm}x{bn}x{bk} "
                  f"w{warps} s{stages} tma={tma} flatten={flatten}: {ms:.3f} ms = {ratio:.3f} x matmul "
                  f"(rel. err {err:.1e})", flush=True)
        report["results"].append(row)
    with open(os.path.join(out_dir, "gemm-core.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("\n| per-rank M x N x K | torch.matmul | best persistent_gemm | setting | ratio |")
    for row in report["results"]:
        best = min(row["settings"], key=lambda s: s["ms"])
        print(f"| {row['shape']} | {row['matmul_ms']:.3f} ms | {best['ms']:.3f} ms | {best['block']} w{best['num_warps']} "
              f"s{best['num_stages']} tma={best['tma']} flatten={best['flatten']} | {best['vs_matmul']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1])
