"""Few-row (inference) shapes on one GPU, in one run: each fused kernel against torch.matmul at world size 1,
the standalone all-reduce against torch's symmetric-memory two-shot at one rank, and a small all-reduce with
two ranks sharing the GPU. Prints the tables; writes every figure as JSON.

    python3 benchmarks/inference_shapes.py OUT.json [--algorithms two_shot ...] [--sizes 1 4 16 64 256]

Ratios are fused time / torch.matmul time (lower is better; 1.0 = the GEMM alone), each kernel validated
against a torch reference in the same run (``Cluster.compare_to_unfused``, tuned defaults per shape). The
all-reduce's "effective" bandwidth is the message size over the time (the figure the issue names); at one
rank the memory traffic is at least twice that (read the input, write the result).
"""

import argparse
import datetime
import json

import torch
import triton

import gemmar
from gemmar.algorithms import builtin_names
from gemmar.tuning import tuned_defaults
from gemmar.runtime.backends import gpu_properties

# per-rank M x N x K_r: the table, then the large square shape
SHAPES = [(4096, 8192, 1024), (1024, 8192, 3584), (256, 8192, 8192), (64, 8192, 3584), (16, 8192, 1024),
          (8192, 8192, 8192)]
ALGORITHMS = builtin_names()


def gemm_figures(algorithms, shapes):
    rows = []
    with gemmar.Cluster(world_size=1, backend="cuda", heap_size=8 << 30) as cluster:
        for m, n, k in shapes:
            configs = {}
            for algorithm in algorithms:
                knobs = tuned_defaults("cuda", algorithm, *gpu_properties("cuda")[1:], shape=(m, n, k, 1), given={})
                configs[algorithm] = gemmar.RunConfig(m=m, n=n, k=k, datatype="bf16", algorithm=algorithm,
                                                      world_size=1, **knobs)
            figures = cluster.compare_to_unfused(configs)
            row = dict(shape=[m, n, k], matmul_ms=figures["matmul_ms"],
                       knobs={a: {key: getattr(c, key) for key in ("BLK_M", "BLK_N", "BLK_K", "num_sms", "comm_sms")}
                              for a, c in configs.items()})
            for algorithm in algorithms:
                row[f"{algorithm}_ms"] = figures[f"{algorithm}_ms"]
                row[f"{algorithm}_ratio"] = figures[f"{algorithm}_ms"] / figures["matmul_ms"]
                row[f"{algorithm}_right"] = figures[f"{algorithm}_max_abs_diff"] <= figures[f"{algorithm}_tolerance"]
            rows.append(row)
            print(f"{m} x {n} x {k}: matmul {row['matmul_ms'] * 1e3:.1f} us; " +
                  ", ".join(f"{a} {row[a + '_ratio']:.2f}x{'' if row[a + '_right'] else ' WRONG'}" for a in algorithms),
                  flush=True)
    return rows


def dram_gb_s():
    """The GPU's memory bandwidth from its memory clock and bus width (Triton asks the driver), or None."""
    try:
        from triton.testing import get_dram_gbps

        return float(get_dram_gbps())
    except Exception:  # noqa: BLE001 - an older Triton, or a driver that does not say: the share is left out
        return None


def allreduce_figures(sizes):
    rows = []
    peak = dram_gb_s()
    if peak:
        print(f"the GPU's memory bandwidth (memory clock x bus width): {peak:.0f} GB/s", flush=True)
    with gemmar.Cluster(world_size=1, backend="cuda", heap_size=4 << 30) as cluster:
        for mib in sizes:
            numel = int(mib * 2 ** 20) // 2
            # Values copied in by each launch, and values already on the heap (as torch's symmetric-memory
            # all-reduce has them: its buffer is filled before it is timed).
            for on_heap in (False, True):
                f = cluster.all_reduce(numel, "bf16", reps=50, baseline=on_heap, on_heap=on_heap)
                row = dict(mib=mib, on_heap=on_heap, comm_sms=f["comm_sms"], gemmar_ms=f["gemmar_ms"], ok=f["ok"],
                           effective_gbs=mib * 2 ** 20 / (f["gemmar_ms"] * 1e-3) / 1e9)
                if peak:   # at one rank the input is read and the result written: twice the bytes
                    row.update(dram_gb_s=peak, share_of_dram=2 * row["effective_gbs"] / peak)
                if "torch_symm_mem_ms" in f:
                    row.update(torch_symm_mem_ms=f["torch_symm_mem_ms"],
                               speed_vs_symm_mem=f["torch_symm_mem_ms"] / f["gemmar_ms"])
                rows.append(row)
                versus = (f"; torch symm-mem {row['torch_symm_mem_ms']:.3f} ms ({row['speed_vs_symm_mem']:.2f}x its "
                          f"speed)" if "torch_symm_mem_ms" in row else "")
                share = f" ({100 * row['share_of_dram']:.0f} % of the memory's, read + write)" if peak else ""
                print(f"all-reduce {mib:g} MiB{' on the heap' if on_heap else ''}, {row['comm_sms']} programs: "
                      f"{row['gemmar_ms']:.3f} ms, {row['effective_gbs']:.0f} GB/s effective{share}{versus}"
                      f"{'' if row['ok'] else ' WRONG'}", flush=True)
    with gemmar.Cluster(world_size=2, backend="cuda") as cluster:   # ranks sharing the GPU
        f = cluster.all_reduce(2 ** 19, "bf16", reps=50)
        rows.append(dict(mib=1, world_size=2, shared_gpu=True, comm_sms=f["comm_sms"], gemmar_ms=f["gemmar_ms"],
                         ok=f["ok"]))
        print(f"all-reduce 1 MiB, 2 ranks sharing the GPU: {f['gemmar_ms']:.3f} ms", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where the JSON goes")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256], help="all-reduce MiB")
    parser.add_argument("--no_gemm", action="store_true")
    args = parser.parse_args()
    report = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
                  triton=triton.__version__, gpu=torch.cuda.get_device_name(0))
    report["gemm"] = [] if args.no_gemm else gemm_figures(args.algorithms, SHAPES)
    report["allreduce"] = allreduce_figures(args.sizes)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
