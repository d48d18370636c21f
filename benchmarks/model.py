"""The performance model (gemmar/analysis/model.py; at few rows, lab/models/few_rows.py) checked against the
measured 2 x H200 figures, then its predictions for two_shot at W = 2 and W = 8; no GPU needed.

    python3 benchmarks/model.py [--two_gpu FILE] [--one_gpu FILE]   (default: the runs in gemmar/analysis/measured/)
                                [--two_shot_from LATER_RUN.json] [--link_gb_s 450] [--nccl_bus_gb_s 270]

``--two_shot_from``: two_shot's world-size-1 ratios from a later one-GPU run (``fused_vs_unfused.py --world_size 1
--algorithms two_shot``), atomics' and ring's still from ``--one_gpu``. Only runs from before 2026-12-03
evening stand for a rank at W >= 2: since then a world-size-1 launch writes each tile straight into C and
skips the partials' trip through memory, which every tile makes at W >= 2 (``two_shot.write_alone_tile``).
"""

import argparse
import os
import sys

from gemmar.analysis import model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the lab (lab/README.md)
from lab.models import few_rows as fixed_costs  # noqa: E402


def main(args):
    measured, machine, one_gpu = model.load_inputs(args.two_gpu, args.one_gpu, two_shot_from=args.two_shot_from)
    if args.two_shot_from:
        print(f"two_shot's world-size-1 ratios from {args.two_shot_from}")
    machine.link_gb_s, machine.nccl_bus_gb_s = args.link_gb_s, args.nccl_bus_gb_s
    print(f"inputs: matmul times of {args.two_gpu}, world-size-1 ratios of {args.one_gpu}; link "
          f"{machine.link_gb_s:g} GB/s per direction, NCCL bus {machine.nccl_bus_gb_s:g} GB/s, two_shot tail "
          f"{one_gpu.two_shot_tail_us:g} us; exposure {model.EXPOSURE}")
    rows = model.check(measured, 2, machine, one_gpu)
    print("| algorithm | per-rank M x N x K | measured 2 x H200 | model | error |\n|---|---|---|---|---|")
    for alg, shape, ms, pred, err in rows:
        print(f"| {alg} | {' x '.join(map(str, shape))} | {ms:.3f} ms | {pred:.3f} ms | {100 * err:+.1f} % |")
    gpu = model.Gpu()
    local = args.two_shot_from or os.path.join(model.MEASURED, model.CHECKED_AGAINST[2])
    print(f"\ntwo_shot's one-GPU time estimated (for shapes nobody measured: --algorithm auto), against "
          f"{local}; {gpu}")
    print("| per-rank M x N x K | measured, world size 1 | estimate | error |\n|---|---|---|---|")
    for shape, ms, estimate, err in model.check_local(local, gpu):
        print(f"| {' x '.join(map(str, shape))} | {ms:.3f} ms | {estimate:.3f} ms | {100 * err:+.1f} % |")
    few_rows = os.path.join(model.MEASURED, model.FEW_ROWS_RUN)
    print(f"\ninference shapes on 2 x H200 ({few_rows}), predicted as shapes nobody measured:")
    print("| per-rank M x N x K | two_shot measured | model | sequential measured | model |\n|---|---|---|---|---|")
    for shape, tm, t, qm, q in model.few_rows_checks(few_rows, machine, gpu):
        print(f"| {' x '.join(map(str, shape))} | {tm:.3f} ms | {t:.3f} ms ({100 * (t / tm - 1):+.0f} %) | {qm:.3f} ms | "
              f"{q:.3f} ms ({100 * (q / qm - 1):+.0f} %) |")
    few_rows_predictions(few_rows, machine, gpu)
    print()
    for shape in [*measured, (4096, 4096, 4096), (2048, 2048, 8192), (16384, 16384, 4096), (16, 8192, 1024),
                  (256, 8192, 8192)]:
        for W in (2, 8):
            predicted = model.predict_unmeasured(shape, W)
            print(f"--algorithm auto, {' x '.join(map(str, shape))} per rank on {W} GPUs: " + (
                f"{'two_shot' if predicted[0] < predicted[1] else 'unfused'}: two_shot {predicted[0]:.3f} ms against "
                f"cuBLAS then NCCL {predicted[1]:.3f} ms" if predicted else "the model does not speak"))
    try:
        predictions = model.predict("two_shot", list(measured), (2, 8), machine, one_gpu, rows)
    except ValueError as e:
        print(f"no prediction: {e}")
        return
    print("\n| two_shot, predicted | W | fused | sequential | fused / sequential |\n|---|---|---|---|---|")
    for (shape, W), (fused, seq) in predictions.items():
        print(f"| {' x '.join(map(str, shape))} | {W} | {fused:.3f} ms | {seq:.3f} ms | {fused / seq:.2f} |")


# Tensor-parallel inference: a Llama-70B-like MLP down projection (28672 -> 8192), its K split over W ranks.
FEW_ROWS_K, FEW_ROWS_N, FEW_ROWS_M = 28672, 8192, (16, 64, 256, 1024)


def few_rows_predictions(few_rows, machine, gpu):
    """The same shapes with fixed costs (``fixed_costs.FixedCosts``): each predicted from the other four's, then
    every cost fitted on all five and inference shapes predicted at W = 2 and 8."""
    print("\nwith fixed costs, each shape predicted from the other four's (leave one out: a check the fit did "
          "not see):")
    print("| per-rank M x N x K | fitted on the others: NCCL floor, two_shot extra | two_shot measured | model | "
          "sequential measured | model |\n|---|---|---|---|---|---|")
    worst = 0.0
    for shape, costs, tm, t, qm, q in fixed_costs.few_rows_leave_one_out(few_rows, gpu, machine):
        worst = max(worst, abs(t / tm - 1), abs(q / qm - 1))
        print(f"| {' x '.join(map(str, shape))} | {costs.nccl_floor_us:.0f} us, {costs.two_shot_extra_us:.0f} us | "
              f"{tm:.3f} ms | {t:.3f} ms ({100 * (t / tm - 1):+.0f} %) | {qm:.3f} ms | {q:.3f} ms "
              f"({100 * (q / qm - 1):+.0f} %) |")
    costs = fixed_costs.fit_fixed_costs(model.read_run(few_rows)["results"], gpu, machine)
    print(f"\nPREDICTED, not measured (fixed costs fitted on all five: NCCL floor {costs.nccl_floor_us:.0f} us, "
          f"two_shot extra {costs.two_shot_extra_us:.0f} us, matmul at least {costs.matmul_floor_us:.0f} us; at "
          f"W = 8 the same costs, an assumption; off by up to {100 * worst:.0f} % where checked): "
          f"M = {', '.join(map(str, FEW_ROWS_M))} rows x {FEW_ROWS_N} x {FEW_ROWS_K} / W per rank")
    print("| W | per-rank M x N x K | matmul (estimated) | two_shot | matmul then NCCL | two_shot / sequential |\n"
          "|---|---|---|---|---|---|")
    for W in (2, 8):
        for m in FEW_ROWS_M:
            shape = (m, FEW_ROWS_N, FEW_ROWS_K // W)
            mm, fused, sequential = fixed_costs.predict_few_rows_unmeasured(shape, W, costs, gpu, machine)
            print(f"| {W} | {' x '.join(map(str, shape))} | {mm:.3f} ms | {fused:.3f} ms | {sequential:.3f} ms | "
                  f"{fused / sequential:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--two_gpu", default=os.path.join(model.MEASURED, model.CHECKED_AGAINST[0]))
    parser.add_argument("--one_gpu", default=os.path.join(model.MEASURED, model.CHECKED_AGAINST[1]))
    parser.add_argument("--two_shot_from", help="a later world-size-1 run for two_shot's ratios")
    parser.add_argument("--link_gb_s", type=float, default=model.Machine.link_gb_s)
    parser.add_argument("--nccl_bus_gb_s", type=float, default=model.Machine.nccl_bus_gb_s)
    try:
        main(parser.parse_args())
    except model.UsageError as e:
        sys.exit(f"model: {e}")
