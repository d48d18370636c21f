"""Fused GEMM + all-reduce against cuBLAS + NCCL (sequential, and overlapped in row blocks), one GPU per
rank, in one run; writes JSON figures and traces.

    python3 benchmarks/fused_vs_unfused.py OUTDIR [--world_size W] [--sweep] [--algorithms A ...] [--no_traces]
                                          [--shapes large inference]

Per-rank shapes M x N x K_r (the global K is K_r * world size), bf16, every algorithm, median of 5 trials
of 20 back-to-back launches each, every kernel validated against an fp32 torch reference before and after
timing. W defaults to 2; W = 1 on one GPU times the GEMM side of each kernel (NCCL then has nobody to talk
to). ``--sweep`` first times a few tile configurations per algorithm on the first shape.
"""

import argparse
import datetime
import json
import os

import torch
import triton

import gemmar
from gemmar.algorithms import builtin_names
from gemmar.report import print_figures
from gemmar.runtime.backends import gpu_properties
from gemmar.tuning import tuned_defaults

SHAPES = {"large": [(8192, 8192, 8192), (4096, 8192, 14336), (8192, 8192, 2048)],
          # few rows (inference): the five shapes of inference_shapes.py, per rank
          "inference": [(4096, 8192, 1024), (1024, 8192, 3584), (256, 8192, 8192), (64, 8192, 3584), (16, 8192, 1024)]}
ALGORITHMS = builtin_names()
SWEEP = {"atomics": [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (256, 128, 64, 8, 3)],
         "ring": [(128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3)]}
TRACED = [(8192, 8192, 8192), (8192, 8192, 2048)]


def config_for(m, n, k_rank, algorithm, W, **over):
    knobs = tuned_defaults("cuda", algorithm, *gpu_properties("cuda")[1:], shape=(m, n, k_rank, W), given=over)
    return gemmar.RunConfig(m=m, n=n, k=k_rank * W, datatype="bf16", algorithm=algorithm, world_size=W, **knobs)


def main(out_dir, W, sweep, algorithms=ALGORITHMS, traces=True, shapes=("large",)):
    os.makedirs(out_dir, exist_ok=True)
    report = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
                  triton=triton.__version__, gpu=torch.cuda.get_device_name(0), results=[], sweep=[])
    with gemmar.Cluster(world_size=W, backend="cuda", heap_size=3 << 30) as cluster:
        if sweep:
            m, n, k = SHAPES["large"][0]
            for alg, configs in SWEEP.items():
                for bm, bn, bk, warps, stages in configs:
                    cfg = config_for(m, n, k, alg, W, BLK_M=bm, BLK_N=bn, BLK_K=bk, num_warps=warps,
                                     num_stages=stages)
                    f = cluster.compare_to_unfused(cfg, baseline=False)
                    print(f"[sweep] {alg:8s} {bm}x{bn}x{bk} w{warps} s{stages}: {f[alg + '_ms']:.3f} ms "
                          f"(max|C - ref| {f[alg + '_max_abs_diff']:.3g})", flush=True)
                    report["sweep"].append(dict(algorithm=alg, block=(bm, bn, bk), num_warps=warps,
                                                num_stages=stages, ms=f[alg + "_ms"]))
        for m, n, k in [shape for group in shapes for shape in SHAPES[group]]:
            configs = {alg: config_for(m, n, k, alg, W) for alg in algorithms}
            figures = cluster.compare_to_unfused(configs)
            print_figures(figures, configs)
            report["results"].append(dict(shape=(m, n, k), configs={a: c.to_dict() for a, c in configs.items()},
                                          **figures))
        for m, n, k in TRACED if traces else ():
            for alg in algorithms:
                cfg = config_for(m, n, k, alg, W, trace=True, iterations=3)
                result = cluster.bench(cfg)
                path = os.path.join(out_dir, f"{W}-gpus-{alg}-{m}x{n}x{k}.trace.json.gz")
                result.trace.save(path)
                s = result.trace.summary()
                print(f"[trace] {path}: ok={result.ok} span {s['span_us'].max():.0f} us, comm hidden "
                      f"{100 * s['hidden_share'].mean():.0f} %", flush=True)
    with open(os.path.join(out_dir, f"{W}-gpus-fused-vs-unfused.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--world_size", type=int, default=2, help="ranks, one GPU each (default 2)")
    parser.add_argument("--sweep", action="store_true", help="first time a few tile configurations")
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS),
                        help="the fused kernels to time (default: all three)")
    parser.add_argument("--no_traces", action="store_true", help="skip the traced runs at the end")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["large"],
                        help="which shapes: the three large ones and/or the five inference ones (default large)")
    args = parser.parse_args()
    if not 1 <= args.world_size <= torch.cuda.device_count():
        parser.error(f"--world_size {args.world_size}: this machine has {torch.cuda.device_count()} GPU(s); "
                     "give 1 to that many")
    main(args.out_dir, args.world_size, args.sweep, args.algorithms, not args.no_traces, args.shapes)
