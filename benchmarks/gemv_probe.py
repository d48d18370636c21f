"""Few rows on one GPU: ``kernels/two_shot.one_rank_gemv`` (one program per column block and K share, not persistent)
against torch.matmul and today's ``auto`` at issue 60's shapes with M <= 64, every result checked against torch.

    python3 benchmarks/gemv_probe.py OUT.json [--max_m 64] [--max_seconds 400]
    python3 benchmarks/gemv_probe.py --analyse OUT.json        (no GPU: the figures and the best setting per shape)

Per shape: torch.matmul; ``auto`` (what two_shot at world size 1 runs today: the tile rule and the split rule,
through the package's launcher); then one_rank_gemv launched straight (no heap, no launcher), at each block in
BLOCKS (by a 16-row dot: M padded to 16, 32 or 64 rows; and, at M = 1, by multiply-add: ROW_BLOCKS) and each
number of K shares in SHARES that leaves a share at least one step. Ratios are time / torch.matmul's, ``gpu``
(the host's time hidden) and ``wall`` (a user's loop), medians of the tuner's trials.
"""

import argparse
import datetime
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shape_sweep import SHAPES, shape_name  # noqa: E402  (benchmarks/ is this script's folder)

# (BLOCK_N, BLOCK_K, num_warps, num_stages) by a 16-row dot (rows: M padded), and by multiply-add at M = 1
BLOCKS = [(64, 128, 4, 3), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 3), (128, 64, 4, 4), (32, 256, 4, 3),
          (128, 128, 8, 3), (256, 64, 8, 3)]
ROW_BLOCKS = [(64, 64, 4, 1), (128, 32, 4, 1), (128, 64, 4, 2), (256, 32, 4, 2), (256, 64, 8, 2), (512, 32, 8, 2),
              (128, 128, 8, 2), (64, 128, 4, 2)]
SHARES = (1, 2, 4, 8, 16, 32)


def run(args):
    import torch
    import triton

    from gemmar.kernels.two_shot import one_rank_gemv
    from gemmar.runtime.backends import gpu_properties
    from gemmar.tuner import TOLERANCE, config_for, inputs, one_gpu_rank, relative_error, time_call, \
        time_config, time_matmul
    from gemmar.tuning import tuned_defaults

    gpu, capability, sms = gpu_properties("cuda")
    shapes = [s for s in SHAPES if s["m"] <= args.max_m]
    report = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), gpu=gpu, sms=sms,
                  torch=torch.__version__, triton=triton.__version__, command=" ".join(sys.argv), results=[])
    started = time.monotonic()
    dummy = torch.zeros(8, dtype=torch.int64, device="cuda")
    with one_gpu_rank(2 << 30) as heap:
        for i, s in enumerate(shapes):
            if time.monotonic() - started > args.max_seconds:
                report["stopped_early"] = len(shapes) - i
                print(f"stopping at {args.max_seconds} s: {len(shapes) - i} shapes left", flush=True)
                break
            m, n, k = s["m"], s["n"], s["k"]
            A, B, ref = inputs(m, n, k, "bf16", seed=i)
            mm = time_matmul(A, B)
            knobs = tuned_defaults("cuda", "two_shot", capability, sms, shape=(m, n, k, 1), given={}, gpu=gpu,
                                   datatype="bf16")
            auto = dict(time_config(heap, config_for(m, n, k, "bf16", "two_shot", knobs), A, B, ref, mm["gpu_ms"]),
                        tile=[knobs[x] for x in ("BLK_M", "BLK_N", "BLK_K", "num_warps", "num_stages")],
                        split_k=knobs["split_k"])
            row = dict(s, matmul=mm, auto=auto, gemv=[])
            C = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            rows = max(16, triton.next_power_of_2(m))
            families = [(True, rows, b) for b in BLOCKS] + ([(False, 1, b) for b in ROW_BLOCKS] if m == 1 else [])
            for by_dot, block_m, (block_n, block_k, warps, stages) in families:
                steps = -(-k // block_k)
                blocks = -(-n // block_n)
                for split in (x for x in SHARES if x <= steps):
                    slices = torch.empty(blocks * split * block_m, block_n, dtype=torch.float32, device="cuda")
                    slices_in = torch.zeros(blocks, dtype=torch.int32, device="cuda")

                    def launch():
                        one_rank_gemv[(blocks * split,)](
                            A, B, C, C, slices, slices_in, m, n, k, A.stride(0), A.stride(1), B.stride(0),
                            B.stride(1), C.stride(0), C.stride(1), split, dummy, dummy, BLOCK_M=block_m,
                            BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION="tf32", TRACE_CAPACITY=0,
                            EVEN_K=k % block_k == 0, BY_DOT=by_dot, num_warps=warps, num_stages=stages)
                    entry = dict(by_dot=by_dot, block=[block_m, block_n, block_k, warps, stages], split_k=split)
                    try:
                        C.fill_(float("nan"))
                        launch()
                        err = relative_error(C, ref)
                        launch()
                        launch()
                        timing = time_call(launch, mm["gpu_ms"])
                        err = max(err, relative_error(C, ref))
                        entry.update(timing, rel_err=err, ok=err <= TOLERANCE["bf16"])
                    except Exception as e:  # noqa: BLE001 - a setting that does not compile is a figure too
                        torch.cuda.synchronize()
                        entry.update(ok=False, error=f"{type(e).__name__}: {str(e).strip()[:200]}")
                    row["gemv"].append(entry)
            row["matmul_after"] = time_matmul(A, B)
            report["results"].append(row)
            print(line(row), flush=True)
            with open(args.out + ".part", "w") as f:
                json.dump(report, f)
            os.replace(args.out + ".part", args.out)
    report["seconds"] = round(time.monotonic() - started, 1)
    with open(args.out, "w") as f:
        json.dump(report, f)
    print(f"wrote {args.out} ({report['seconds']} s)")
    analyse([args.out])


def best(row, how):
    good = [g for g in row["gemv"] if g.get("ok")]
    return min(good, key=lambda g: g[how + "_ms"]) if good else None


def line(row, how="gpu"):
    mm = row["matmul"][how + "_ms"]
    auto = row["auto"].get(how + "_ms")
    top = best(row, how)
    wrong = sum(not g.get("ok") and "error" not in g for g in row["gemv"])
    return (f"{shape_name(row):>16}  matmul {mm * 1e3:6.1f} us  auto {auto / mm if auto else float('nan'):5.2f}  "
            f"gemv best {top[how + '_ms'] / mm if top else float('nan'):5.2f} "
            f"{'dot' if top and top['by_dot'] else 'fma'} {top['block'] if top else ''} x{top['split_k'] if top else ''}"
            + (f"  WRONG {wrong}" if wrong else ""))


def analyse(paths):
    rows = [r for p in paths for r in json.load(open(p))["results"]]
    for how in ("gpu", "wall"):
        print(f"-- {how} (time / torch.matmul's)")
        for r in rows:
            print(line(r, how))
        ratios = {"auto": [r["auto"][how + "_ms"] / r["matmul"][how + "_ms"] for r in rows if "gpu_ms" in r["auto"]],
                  "gemv best": [best(r, how)[how + "_ms"] / r["matmul"][how + "_ms"] for r in rows if best(r, how)],
                  "best of both": [min(best(r, how)[how + "_ms"], r["auto"].get(how + "_ms", 1e9)) /
                                   r["matmul"][how + "_ms"] for r in rows if best(r, how)]}
        for name, values in ratios.items():
            values = sorted(values)
            print(f"   {name:>12}: median {values[len(values) // 2]:.3f}  worst {values[-1]:.3f}  geomean "
                  f"{math.exp(sum(map(math.log, values)) / len(values)):.3f}  ({len(values)} shapes)")

    rule_and_lomo(rows)


def bucket(m):
    return 1 if m == 1 else 16 if m <= 16 else 64


def rule_ratio(row, by_dot, block, sms):
    """GPU time / matmul's of ``block`` (BLOCK_N, BLOCK_K, warps, stages) at ``row``'s shape with the slices the
    rule gives it (tuning.gemv_split: at one row by multiply-add 3 programs an SM, else 1), or None if not timed."""
    from gemmar.tuning import GEMV_ROW_PROGRAMS_PER_SM, gemv_split

    split = gemv_split((row["m"], row["n"], row["k"], 1), block[0], block[1], sms,
                       per_sm=1 if by_dot else GEMV_ROW_PROGRAMS_PER_SM)
    hit = [g for g in row["gemv"] if g.get("ok") and g["by_dot"] == by_dot and g["block"][1:] == list(block)
           and g["split_k"] == split]
    return hit[0]["gpu_ms"] / row["matmul"]["gpu_ms"] if hit else None


def geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values))


def rule_and_lomo(rows, sms=132):
    """The few-rows kernel's choice, fitted per bucket of rows (1; 2-16; 17-64) as the block with the least geometric
    mean of GPU time / matmul's over the bucket's shapes (each at the slices the rule gives it), then each model's
    shapes under the choice fitted with that model left out: does the choice generalize to a model it never saw?"""
    blocks = sorted({(g["by_dot"], tuple(g["block"][1:])) for r in rows for g in r["gemv"]})

    def fit(train):
        chosen = {}
        for b in (1, 16, 64):
            shapes = [r for r in train if bucket(r["m"]) == b]
            scored = []
            for by_dot, block in blocks:
                ratios = [rule_ratio(r, by_dot, block, sms) for r in shapes]
                if shapes and all(x is not None for x in ratios):
                    scored.append((geomean(ratios), by_dot, block))
            chosen[b] = min(scored)[1:] if scored else None
        return chosen

    every = fit(rows)
    print("-- the choice per bucket of rows, fitted on every shape (GPU time): " +
          "; ".join(f"M {'1' if b == 1 else '2-16' if b == 16 else '17-64'}: {'dot' if c[0] else 'multiply-add'} "
                    f"{list(c[1])}" for b, c in every.items() if c))
    held, fitted = [], []
    for model in sorted({r["model"] for r in rows}):
        choice = fit([r for r in rows if r["model"] != model])
        for r in (r for r in rows if r["model"] == model):
            c, a = choice[bucket(r["m"])], every[bucket(r["m"])]
            out = rule_ratio(r, c[0], c[1], sms) if c else None
            if out is not None:
                held.append(out)
                fitted.append(rule_ratio(r, a[0], a[1], sms))
    for name, values in (("fitted on every model", fitted), ("each model left out", held)):
        values = sorted(values)
        print(f"   {name:>22}: median {values[len(values) // 2]:.3f}  worst {values[-1]:.3f}  geomean "
              f"{geomean(values):.3f}  ({len(values)} shapes)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--analyse", nargs="+")
    parser.add_argument("--max_m", type=int, default=64)
    parser.add_argument("--max_seconds", type=float, default=400)
    args = parser.parse_args()
    if args.analyse:
        analyse(args.analyse)
    elif args.out:
        run(args)
    else:
        parser.error("give OUT.json to measure, or --analyse OUT.json")


if __name__ == "__main__":
    main()
