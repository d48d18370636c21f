"""The one-rank GEMM core's variants at the shapes issue 60's sweep left slow: auto's choice, each candidate tile
whole, and 128 x 256 with its K cut (split-K, and stream-K where the slices give every program a share), against
torch.matmul in the same process. Every result is checked against torch's. (At commit f193094 it also timed warp
specialization and tensor descriptors up to 512 rows, through switches in the package taken out after: docs/decisions.md,
the tile rule and the tuning cache.)

    python3 benchmarks/gemm_core_ab.py OUT.json [--only MxNxK,...] [--max_seconds S]

Prints a line per variant (GPU time / matmul's, wall time / matmul's) and writes JSON after every shape."""

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The shapes issue 60's sweep of 2026-12-07 left over 1.15x by wall or GPU time above 64 rows (run 14), worst first.
SHAPES = ["512x5120x4352", "512x6144x768", "128x5120x3200", "128x5120x2176", "128x7168x2304", "512x16384x6656",
          "1024x5120x3456"]
TILES = [(128, 256, 64, 8, 4, 8), (128, 128, 64, 8, 4, 8), (64, 256, 64, 8, 3, 8), (256, 128, 64, 8, 3, 8)]
MID_TILES = [(64, 128, 64, 4, 4, 8), (64, 128, 128, 4, 4, 8), (128, 128, 64, 4, 4, 8), (128, 128, 64, 8, 4, 8),
             (64, 256, 64, 8, 3, 8), (128, 256, 64, 8, 4, 8)]
CUT_TILES = [(128, 256, 64, 8, 4, 8)]   # (each split compiles anew: WHOLE_TILES and SPLIT_K are constexprs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--only", default="", help="MxNxK,...: these shapes instead")
    parser.add_argument("--max_seconds", type=float, default=540)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()

    import torch
    import triton

    from gemmar import tuner
    from gemmar.config import waves
    from gemmar.runtime.backends import gpu_properties
    from gemmar.tuner import config_for, inputs, one_gpu_rank, tile_knobs, time_config, time_matmul
    from gemmar.tuning import tuned_defaults
    from gemmar.tuning_cache import TILE_KNOBS

    gpu, capability, sms = gpu_properties("cuda")
    tuner.TRIALS = args.trials
    shapes = [tuple(int(x) for x in s.split("x")) for s in (args.only.split(",") if args.only else SHAPES)]
    report = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), gpu=gpu, sms=sms,
                  torch=torch.__version__, triton=triton.__version__, command=" ".join(sys.argv), results=[])
    started = time.monotonic()

    with one_gpu_rank(4 << 30) as heap:
        for i, (m, n, k) in enumerate(shapes):
            A, B, ref = inputs(m, n, k, "bf16", seed=i)
            mm = time_matmul(A, B)
            row = dict(m=m, n=n, k=k, matmul=mm, variants=[])

            def add(name, tile, knobs):
                if time.monotonic() - started > args.max_seconds:
                    return
                got = time_config(heap, config_for(m, n, k, "bf16", "two_shot", knobs), A, B, ref, mm["gpu_ms"])
                got.update(name=name, tile=list(tile), split_k=knobs["split_k"])
                row["variants"].append(got)
                figure = (f"GPU {got['gpu_ms'] / mm['gpu_ms']:.3f} wall {got['wall_ms'] / mm['wall_ms']:.3f}"
                          if got.get("ok") else f"FAILED {got.get('error', got.get('rel_err'))}")
                print(f"{m}x{n}x{k} {name:16s} {tile} split {knobs['split_k']}: {figure}", flush=True)

            # (auto as the package runs it: the GPU's name and the dtype let the tuning cache and the rule answer)
            auto = tuned_defaults("cuda", "two_shot", capability, sms, shape=(m, n, k, 1), given={}, gpu=gpu,
                                  datatype="bf16")
            add("auto", [auto[key] for key in TILE_KNOBS], auto)
            for tile in TILES if m > 512 else MID_TILES:
                add("whole", tile, tile_knobs(tile, sms, split_k=1))
            for tile in CUT_TILES:
                tiles = -(-m // tile[0]) * -(-n // tile[1])
                whole, last_wave = waves(tiles, sms)
                steps = -(-k // tile[2])
                if last_wave >= sms or steps < 8:
                    continue
                fill = -(-sms // last_wave)
                for split in sorted({2, fill} & set(range(2, steps // 4 + 1))):
                    add("stream-K" if split * last_wave > sms else "split-K", tile, tile_knobs(tile, sms, split_k=split))
            row["matmul_after"] = time_matmul(A, B)
            report["results"].append(row)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
            if time.monotonic() - started > args.max_seconds:
                print(f"stopped at {args.max_seconds:.0f} s", flush=True)
                break
    for row in report["results"]:
        good = [v for v in row["variants"] if v.get("ok")]
        if good:
            best = min(good, key=lambda v: v["gpu_ms"])
            print(f"best at {row['m']}x{row['n']}x{row['k']}: {best['name']} {best['tile']} split {best['split_k']} "
                  f"GPU {best['gpu_ms'] / row['matmul']['gpu_ms']:.3f}", flush=True)
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
