"""The all-reduce model (lab/models/allreduce_model.py): its fit on the measured 2-GPU run, then its
predictions for 4 and 8 GPUs at 1 KiB - 1 GiB, made before any run on 4 or 8 GPUs (benchmarks/multi_gpu.sh checks them); no GPU needed.

    python3 benchmarks/allreduce_model.py [--run lab/data/two-gpus-allreduce.json]

Prints, per world size and size, each implementation's predicted time, gemmar's best scheme, and its speed
against the best baseline (NCCL, torch symmetric memory's two-shot); and the one-shot/two-shot crossover.
"""

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the lab (lab/README.md)
from lab.models import allreduce_model as model  # noqa: E402

SIZES = [2 ** k / 1024 for k in range(0, 21, 2)]   # 1 KiB .. 1 GiB, x4 steps, in MiB


def main(path):
    run = model.load(path)
    fits = model.fit(run)
    print(f"{datetime.date.today()}: fitted on {os.path.relpath(path)} (its machine and date: {run['provenance']}); per-peer "
          f"latency share {model.PER_PEER_LATENCY} (assumed)")
    print("| implementation | latency at W = 2 | bus bandwidth | fit error at each measured size (MiB) |\n|---|---|---|---|")
    for f in fits.values():
        errors = ", ".join(f"{mib:g}: {100 * e:+.0f} %" for mib, e in f.errors.items())
        print(f"| {f.implementation} | {1e3 * f.latency_ms:.1f} us | {f.gb_s:.0f} GB/s | {errors} |")
    print("\n| W | MiB | gemmar two_shot | one_shot | torch symm-mem two-shot | NCCL | gemmar's best / best baseline |"
          "\n|---|---|---|---|---|---|---|")
    for r in model.predictions(fits, SIZES, (2, 4, 8)):
        print(f"| {r['world_size']} | {r['mib']:g} | {1e3 * r['gemmar_two_shot_ms']:.1f} us | "
              f"{1e3 * r['gemmar_one_shot_ms']:.1f} us | {1e3 * r['symm_mem_two_shot_ms']:.1f} us | "
              f"{1e3 * r['nccl_ms']:.1f} us | {r['best_scheme']}: {r['speed_vs_best_baseline']:.2f}x "
              f"{r['best_baseline']}'s speed |")
    for W in (2, 4, 8):
        print(f"one_shot predicted faster than two_shot below {model.one_shot_crossover_mib(fits, W):.2f} MiB at W = {W}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=model.MEASURED_RUN, help="a measured 2-GPU run (JSON)")
    main(parser.parse_args().run)
