"""two_shot with ranks sharing one GPU, traced: how long each iteration goes on after the last GEMM tile of
any rank (the tail), and how far apart the ranks start (the host's launch cost per rank).

    python3 benchmarks/two_shot_tail.py OUTDIR [--world_sizes 2 4] [--k_per_rank 4096]
    python3 benchmarks/two_shot_tail.py --read TRACE.json.gz [...]     # the figures of saved traces, no GPU

8192 x 8192 C (2048 tiles of 128 x 256), bf16, the tuned defaults for the shape (``tuning.tuned_defaults``:
GEMM and communication programs split by ``tuning.split_programs``). Writes each trace as OUTDIR/1-gpu-two_shot-W-ranks-....gz.
"""

import argparse
import os

import gemmar
from gemmar.tuning import tuned_defaults
from gemmar.runtime.backends import gpu_properties


def print_figures(name, trace):
    for iteration, r in trace.launches().iterrows():
        gaps = ", ".join(f"{g:.0f}" for g in r["start_gaps_us"]) or "-"
        print(f"[tail] {name} iteration {iteration}: span {r['span_us']:.0f} us, after the last GEMM tile "
              f"{r['tail_us']:.0f} us ({100 * r['tail_share']:.1f} %), consecutive ranks start {gaps} us apart",
              flush=True)
    medians = ", ".join(f"{kind} {us:.2f}" for kind, us in sorted(trace.event_medians().items()))
    print(f"[tail] {name} median event durations (us): {medians}", flush=True)


def main(out_dir, world_sizes, k_per_rank, comm_sms=None):
    os.makedirs(out_dir, exist_ok=True)
    for W in world_sizes:
        with gemmar.Cluster(world_size=W, backend="cuda", heap_size=1 << 30) as cluster:
            _, capability, sms = gpu_properties("cuda")
            knobs = tuned_defaults("cuda", "two_shot", capability, sms // W,   # all resident at once
                                   shape=(8192, 8192, k_per_rank, W),
                                   given={"comm_sms": comm_sms} if comm_sms else None, trace=True, shared=True)
            config = gemmar.RunConfig(m=8192, n=8192, k=k_per_rank * W, datatype="bf16", algorithm="two_shot",
                                      world_size=W, trace=True, iterations=4, **knobs)
            result = cluster.bench(config)
            path = os.path.join(out_dir, f"1-gpu-two_shot-{W}ranks-8192x8192x{k_per_rank * W}.trace.json.gz")
            result.trace.save(path)
            print(f"[tail] {path}: ok={result.ok}, max|C - ref| {result.max_abs_diff:.3g}, "
                  f"{config.num_sms} GEMM + {config.comm_sms} communication programs per rank", flush=True)
            print_figures(f"W={W}", result.trace)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--k_per_rank", type=int, default=4096)
    parser.add_argument("--comm_sms", type=int, help="communication programs per rank (default: tuning.split_programs)")
    parser.add_argument("--read", nargs="+", help="saved traces to read instead of running")
    args = parser.parse_args()
    if args.read:
        for path in args.read:
            print_figures(os.path.basename(path), gemmar.Trace.load(path))
    elif not args.out_dir:
        parser.error("give OUTDIR (to run on the GPU) or --read TRACE...")
    else:
        main(args.out_dir, args.world_sizes, args.k_per_rank, args.comm_sms)
