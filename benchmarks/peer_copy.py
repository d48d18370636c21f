"""The link's floor on a machine of 2+ GPUs: a plain peer copy between GPU 0 and GPU 1 by the copy engines
(``dst.copy_(src)`` across devices), one way and both ways at once, at each size. An all-reduce of S bytes on
2 GPUs moves S / 2 bytes each way (two-shot: half the partials out, half the sums back), so issue 50 asks the
all-reduce's bus bandwidth to reach 80 % of this copy's one-way figure at 64 MiB and up.

    python3 benchmarks/peer_copy.py OUT.json [--sizes 1 4 16 64 256 1024]   (MiB)

Each figure: median of 5 trials of ``--reps`` copies back to back, host clock around both GPUs' synchronize;
every copy checked (the destination equals the source) before timing.
"""

import argparse
import datetime
import json
import time

import torch


def timed_ms(copies, reps, trials=5):
    """Median over trials of the wall time of ``reps`` rounds of ``copies`` (functions), per round."""
    times = []
    for _ in range(trials):
        for d in (0, 1):
            torch.cuda.synchronize(d)
        start = time.perf_counter()
        for _ in range(reps):
            for copy in copies:
                copy()
        for d in (0, 1):
            torch.cuda.synchronize(d)
        times.append((time.perf_counter() - start) * 1e3 / reps)
    return sorted(times)[len(times) // 2]


def main(out, sizes, reps):
    if torch.cuda.device_count() < 2:
        raise SystemExit(f"peer_copy.py needs 2 GPUs; this machine has {torch.cuda.device_count()}")
    rows = []
    report = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
                  gpu=torch.cuda.get_device_name(0), peer_access=torch.cuda.can_device_access_peer(0, 1), rows=rows)
    print(f"{report['gpu']} x 2, peer access {'on' if report['peer_access'] else 'OFF (copies go through the host)'}")
    for mib in sizes:
        n = int(mib * 2 ** 20)
        a0, b1 = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8,
                                                                                             device="cuda:1")
        a1, b0 = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:1"), torch.empty(n, dtype=torch.uint8,
                                                                                             device="cuda:0")
        b1.copy_(a0)
        b0.copy_(a1)
        right = torch.equal(b1.cpu(), a0.cpu()) and torch.equal(b0.cpu(), a1.cpu())
        one_way = timed_ms([lambda: b1.copy_(a0, non_blocking=True)], reps)
        both = timed_ms([lambda: b1.copy_(a0, non_blocking=True), lambda: b0.copy_(a1, non_blocking=True)], reps)
        row = dict(mib=mib, right=right, one_way_ms=one_way, one_way_gb_s=n / one_way / 1e6, both_ways_ms=both,
                   both_ways_gb_s_each=n / both / 1e6)
        rows.append(row)
        print(f"{mib:g} MiB: one way {one_way:.3f} ms ({row['one_way_gb_s']:.0f} GB/s), both ways at once "
              f"{both:.3f} ms ({row['both_ways_gb_s_each']:.0f} GB/s each way){'' if right else ' WRONG'}", flush=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where the JSON goes")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256, 1024], help="MiB")
    parser.add_argument("--reps", type=int, default=20, help="copies per trial (default 20)")
    args = parser.parse_args()
    main(args.out, args.sizes, args.reps)
