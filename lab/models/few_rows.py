"""The fused kernels' fixed costs at few rows (16-4096 per rank), fitted on a measured 2-GPU run, and the
predictions made from them (labelled predictions): what ``benchmarks/model.py`` prints for inference shapes.

Lab code: only the benchmarks and their tests use it. It moved here from ``gemmar/analysis/model.py`` (issue 59),
whose functions it builds on; ``--algorithm auto`` does not use these fits (the model does not speak at few rows).
"""

import dataclasses
import statistics

from gemmar.analysis.model import link_ms, matmul_ms, read_run, two_shot_local_ms


@dataclasses.dataclass
class FixedCosts:
    """A launch's fixed costs at few rows, fitted on a measured 2-GPU run (:func:`fit_fixed_costs`)."""

    nccl_floor_us: float      # NCCL's all-reduce takes at least this long, however small the message
    two_shot_extra_us: float  # two_shot beyond max(its GEMM, its link bytes): two kernels, two exchanges of flags
    matmul_floor_us: float    # the least torch.matmul took in the run (a launch's own floor, in a loop)


def fit_fixed_costs(results, gpu, machine, leave_out=None):
    """FixedCosts from a measured run's ``results`` (shape, matmul_ms, allreduce_ms, two_shot_ms), leaving out
    the shape ``leave_out``: the floor is the median of NCCL's all-reduce time where its bytes would take
    less than half of it at the bus bandwidth (latency-bound), two_shot's extra the median of its time beyond
    max(GEMM, link)."""
    floors, extras, matmuls = [], [], []
    for r in results:
        shape = tuple(r["shape"])
        if shape == leave_out:
            continue
        m, n, _ = shape
        if link_ms("nccl", m, n, 2, machine) < 0.5 * r["allreduce_ms"]:
            floors.append(r["allreduce_ms"])
        matmuls.append(r["matmul_ms"])
        local = two_shot_local_ms(shape, r["matmul_ms"], 2, gpu)
        extras.append(r["two_shot_ms"] - max(local, link_ms("two_shot", m, n, 2, machine)))
    return FixedCosts(1e3 * statistics.median(floors), 1e3 * statistics.median(extras), 1e3 * min(matmuls))


def predict_few_rows(shape, W, mm_ms, costs, gpu, machine):
    """(two_shot ms, matmul then NCCL ms) at a few-rows shape on W GPUs: two_shot ``max(GEMM, link) + extra``,
    NCCL ``max(floor, bus bytes / bus bandwidth)``; at W > 2 with the costs fitted at W = 2 (an assumption:
    both exchange with every peer at once, over NVSwitch)."""
    m, n, _ = shape
    local = two_shot_local_ms(shape, mm_ms, W, gpu)
    fused = max(local, link_ms("two_shot", m, n, W, machine)) + costs.two_shot_extra_us / 1e3
    nccl = max(costs.nccl_floor_us / 1e3, link_ms("nccl", m, n, W, machine))
    return fused, mm_ms + nccl


def predict_few_rows_unmeasured(shape, W, costs, gpu, machine):
    """The same where torch.matmul's time was not measured either: :func:`matmul_ms`, at least the run's
    least matmul time."""
    mm = max(matmul_ms(shape, gpu), costs.matmul_floor_us / 1e3)
    return (mm, *predict_few_rows(shape, W, mm, costs, gpu, machine))


def few_rows_leave_one_out(path, gpu, machine):
    """[(shape, FixedCosts fitted without it, measured two_shot ms, predicted, measured sequential ms,
    predicted)]: each measured inference shape predicted from the others' fixed costs (a check the fit
    did not see), matmul's time as measured there."""
    results = read_run(path)["results"]
    rows = []
    for r in results:
        shape = tuple(r["shape"])
        costs = fit_fixed_costs(results, gpu, machine, leave_out=shape)
        fused, sequential = predict_few_rows(shape, 2, r["matmul_ms"], costs, gpu, machine)
        rows.append((shape, costs, r["two_shot_ms"], fused, r["sequential_ms"], sequential))
    return rows
