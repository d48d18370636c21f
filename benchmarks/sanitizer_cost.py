"""What sanitize=True costs on cpu ranks: the same runs with and without the sanitizer, in one cluster per world
size, interleaved (plain, sanitized, plain, ...), median seconds per run; and the client's analysis time.

    python3 benchmarks/sanitizer_cost.py [--reps 3]
"""

import argparse
import datetime
import platform
import statistics
import time

import gemmar
from gemmar.sanitizer import analyse

RUNS = [("two_shot", dict(m=128, n=128, k=128, BLK_M=32, BLK_N=32, BLK_K=32, num_sms=2, comm_sms=2)),
        ("ring", dict(m=128, n=128, k=128, BLK_M=32, BLK_N=32, BLK_K=32, num_sms=2)),
        ("atomics", dict(m=128, n=128, k=128, BLK_M=32, BLK_N=32, BLK_K=32, num_sms=2))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"# {datetime.date.today()}, {platform.node()}, {platform.processor() or platform.machine()}, "
          f"gemmar {gemmar.__version__}; 3 iterations per run, median of {args.reps} runs")
    print("| world size | algorithm | plain s | sanitized s | slow-down | accesses | analysis s |")
    print("|---|---|---|---|---|---|---|")
    for world_size in (2, 4):
        with gemmar.Cluster(world_size=world_size, backend="cpu") as cluster:
            for algorithm, shape in RUNS:
                times = {False: [], True: []}
                for rep in range(args.reps + 1):   # (the first pair warms up)
                    for sanitize in (False, True):
                        t = time.perf_counter()
                        result = cluster.bench(algorithm=algorithm, iterations=3, sanitize=sanitize, **shape)
                        elapsed = time.perf_counter() - t
                        assert result.ok
                        if rep:
                            times[sanitize].append(elapsed)
                t = time.perf_counter()
                report = analyse([r.sanitizer for r in result.ranks])
                analysis = time.perf_counter() - t
                assert report.ok, str(report)
                plain, sanitized = statistics.median(times[False]), statistics.median(times[True])
                print(f"| {world_size} | {algorithm} | {plain:.2f} | {sanitized:.2f} | {sanitized / plain:.2f}x | "
                      f"{report.accesses} | {analysis:.2f} |", flush=True)


if __name__ == "__main__":
    main()
