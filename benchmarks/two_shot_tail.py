"""two_shot with ranks sharing one GPU, traced: how long each iteration goes on after the last GEMM tile of
any rank (the tail), and how far apart the ranks start (the host's launch cost per rank).

    python3 benchmarks/two_shot_tail.py OUTDIR [--world_sizes 2 4] [--k_per_rank 4096]
    python3 benchmarks/two_shot_tail.py --read TRACE.json.gz [...]     # the figures of saved traces, no GPU

8192 x 8192 C (2048 tiles of 128 x 256), bf16, the programs of one GPU split between the ranks (as the
launcher does: ``config.shared_gpu_programs``). Writes each trace as OUTDIR/h200x1-two_shot-W-ranks-....gz.
"""

import argparse
import os

import numpy as np

import gemmar
from gemmar.config import tuned_defaults
from gemmar.runtime.backends import gpu_properties


def tail_figures(trace):
    """Per iteration: span (first event of any rank to last), tail (last event after the last GEMM tile of
    any rank), the gaps between consecutive ranks' first events; all in us."""
    rows = []
    for iteration, d in trace.events.groupby("iteration"):
        start, end = d["start_us"].min(), d["end_us"].max()
        last_gemm = d.loc[d["kind"] == "gemm", "end_us"].max()
        firsts = d.groupby("rank")["start_us"].min().sort_index().to_numpy()
        rows.append(dict(iteration=int(iteration), span_us=end - start, tail_us=end - last_gemm,
                         tail_share=(end - last_gemm) / (end - start), start_gaps_us=np.diff(firsts).tolist()))
    return rows


def phase_medians(trace):
    """The median duration (us) of each kind of event, the first iteration (the first launch) left out."""
    d = trace.events
    d = d[d["iteration"] > 0] if (d["iteration"] > 0).any() else d
    return (d["end_us"] - d["start_us"]).groupby(d["kind"]).median().to_dict()


def print_figures(name, trace):
    for r in tail_figures(trace):
        gaps = ", ".join(f"{g:.0f}" for g in r["start_gaps_us"]) or "-"
        print(f"[tail] {name} iteration {r['iteration']}: span {r['span_us']:.0f} us, after the last GEMM tile "
              f"{r['tail_us']:.0f} us ({100 * r['tail_share']:.1f} %), consecutive ranks start {gaps} us apart",
              flush=True)
    medians = ", ".join(f"{kind} {us:.2f}" for kind, us in sorted(phase_medians(trace).items()))
    print(f"[tail] {name} median event durations (us): {medians}", flush=True)


def main(out_dir, world_sizes, k_per_rank):
    os.makedirs(out_dir, exist_ok=True)
    for W in world_sizes:
        with gemmar.Cluster(world_size=W, backend="cuda", heap_size=1 << 30) as cluster:
            _, capability, sms = gpu_properties("cuda")
            knobs = tuned_defaults("cuda", "two_shot", capability, sms // W,   # all resident at once
                                   shape=(8192, 8192, k_per_rank, W))
            config = gemmar.RunConfig(m=8192, n=8192, k=k_per_rank * W, datatype="bf16", algorithm="two_shot",
                                      world_size=W, trace=True, iterations=4, **knobs)
            result = cluster.bench(config)
            path = os.path.join(out_dir, f"h200x1-two_shot-{W}ranks-8192x8192x{k_per_rank * W}.trace.json.gz")
            result.trace.save(path)
            print(f"[tail] {path}: ok={result.ok}, max|C - ref| {result.max_abs_diff:.3g}, "
                  f"{config.num_sms} GEMM + {config.comm_sms} communication programs per rank", flush=True)
            print_figures(f"W={W}", result.trace)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--k_per_rank", type=int, default=4096)
    parser.add_argument("--read", nargs="+", help="saved traces to read instead of running")
    args = parser.parse_args()
    if args.read:
        for path in args.read:
            print_figures(os.path.basename(path), gemmar.Trace.load(path))
    elif not args.out_dir:
        parser.error("give OUTDIR (to run on the GPU) or --read TRACE...")
    else:
        main(args.out_dir, args.world_sizes, args.k_per_rank)
