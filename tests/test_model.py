"""The performance model's arithmetic and its refusal to predict when it does not reproduce what was measured
(its figures are in BENCHMARKS.md, from benchmarks/model.py: none is asserted here)."""

import os
import re
import sys

import pytest

from gemmar.analysis import model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the lab (lab/README.md)
from lab.models import allreduce_model, few_rows  # noqa: E402

SHAPE = (8192, 8192, 8192)
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def inputs():
    machine = model.Machine(matmul_ms={SHAPE: 1.5}, link_gb_s=450.0, nccl_bus_gb_s=270.0, latency_us=10.0)
    one = model.OneGpu(ratio={"atomics": {SHAPE: 1.2}, "ring": {SHAPE: 1.2}, "two_shot": {SHAPE: 1.1}},
                       two_shot_tail_us=16.0)
    return machine, one


def test_bytes_and_times_follow_the_stated_formulas():
    machine, one = inputs()
    c = 8192 * 8192
    assert model.link_bytes("ring", 8192, 8192, 4) == 3 * c * 4
    assert model.link_bytes("two_shot", 8192, 8192, 4) == pytest.approx(1.5 * c * 2)
    assert model.predict_ms("sequential", SHAPE, 1, machine, one) == 1.5           # nothing to reduce
    assert model.predict_ms("sequential", SHAPE, 2, machine, one) == pytest.approx(1.5 + c * 2 / 270e6 + 0.01)
    assert model.predict_ms("ring", SHAPE, 2, machine, one) == pytest.approx(1.8 + c * 4 / 450e6)
    assert model.predict_ms("atomics", SHAPE, 2, machine, one) == pytest.approx(1.8 + 0.5 * c * 4 / 450e6)
    assert model.predict_ms("two_shot", SHAPE, 2, machine, one) == pytest.approx(1.65 + 0.016)


def test_no_prediction_from_a_model_that_misses_a_measured_figure():
    machine, one = inputs()
    good = model.check({SHAPE: {"ring": model.predict_ms("ring", SHAPE, 2, machine, one) * 1.1}}, 2, machine, one)
    assert model.predict("two_shot", [SHAPE], [2], machine, one, good)
    bad = model.check({SHAPE: {"ring": model.predict_ms("ring", SHAPE, 2, machine, one) * 1.3}}, 2, machine, one)
    with pytest.raises(ValueError, match=r"off by 23 % on a measured figure \(allowed 15 %\): it predicts nothing"):
        model.predict("two_shot", [SHAPE], [2], machine, one, bad)


def test_the_saved_figures_load():
    measured, machine, one = model.load_inputs(os.path.join(model.MEASURED, "two-gpus-large-shapes.json"),
                                                os.path.join(model.MEASURED, "one-gpu-large-shapes.json"))
    assert set(measured) == set(machine.matmul_ms) == set(one.ratio["two_shot"])
    assert set(measured[SHAPE]) == {"atomics", "ring", "sequential"}


def test_a_one_gpu_run_without_every_algorithm_is_refused_in_one_line():
    two, later = os.path.join(model.MEASURED, "two-gpus-large-shapes.json"), os.path.join(DATA, "h200x1-bench-2026-12-03.json")
    with pytest.raises(model.UsageError, match=r"has no world-size-1 figure for atomics at 8192 x 8192 x 8192, .*"
                                               r"needs atomics, ring, two_shot at every shape"):
        model.load_inputs(two, later)
    only = model.load_inputs(two, later, algorithms=("two_shot",))[2]   # what --two_shot_from reads
    assert set(only.ratio) == {"two_shot"} and set(only.ratio["two_shot"]) == set(model.load_inputs(two, later, (
        "two_shot",))[0])


def test_two_shot_one_gpu_estimate_follows_its_formula_and_the_saved_run():
    gpu = model.Gpu(sms=132, hbm_gb_s=4000.0, matmul_tflops=705.0)
    split = model.Gpu(sms=132, hbm_gb_s=4000.0, matmul_tflops=705.0, comm_beside_gemm=False)
    # 2048 tiles of 128 x 256 take 16 waves on the 128 GEMM programs left beside 4 communication programs, as
    # on 132: only the partial's round trip (written and read in bf16) is added, in either layout.
    for g in (gpu, split):
        assert model.two_shot_local_ms((8192, 8192, 8192), 1.5, 1, g) == pytest.approx(1.5 + 2 * 8192 * 8192 * 2 / 4e9)
    # 128 tiles on fewer than 128 GEMM programs: two waves where matmul needs one; on all 132, one.
    assert model.two_shot_local_ms((2048, 2048, 8192), 1.0, 2, split) == pytest.approx(2.0 + 2 * 2048 * 2048 * 2 / 4e9)
    assert model.two_shot_local_ms((2048, 2048, 8192), 1.0, 2, gpu) == pytest.approx(1.0 + 2 * 2048 * 2048 * 2 / 4e9)
    assert model.matmul_ms((8192, 8192, 8192), gpu) == pytest.approx(1.56, abs=0.01)
    rows = model.check_local(os.path.join(model.MEASURED, model.CHECKED_AGAINST[2]), gpu)
    assert [r[0] for r in rows] == [(8192, 8192, 8192), (4096, 8192, 14336), (8192, 8192, 2048)]
    assert all(abs(r[3]) <= model.TOLERANCE for r in rows)


def test_choose_refuses_to_speak_without_its_checks(tmp_path):
    assert model.choose((8192, 8192, 8192), 2, data=str(tmp_path)) is None          # no measured figures here
    # A GPU description that puts the one-GPU estimate far from the measured run: the check fails, no choice.
    assert model.choose((8192, 8192, 8192), 2, gpu=model.Gpu(hbm_gb_s=100.0)) is None
    assert model.choose((8192, 8192, 8192), 2)[0] in ("two_shot", "unfused")


def test_the_predicted_timeline_is_drawn_and_labelled(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    measured, machine, one = model.load_inputs(os.path.join(model.MEASURED, "two-gpus-large-shapes.json"),
                                                os.path.join(model.MEASURED, "one-gpu-large-shapes.json"))
    ax = model.draw(SHAPE, 8, machine, one)
    assert ax.get_title().startswith("PREDICTED, not measured: 8192 x 8192 x 8192 per rank on 8 GPUs")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["matmul, then NCCL", "two_shot: GEMM programs",
                                                           "two_shot: communication"]
    ax.figure.savefig(tmp_path / "predicted.png")


@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (8192, 8192, 2048)])
def test_the_drawn_timeline_and_autos_answer_state_the_same_times(shape):
    """Issue 37: notebook 5 drew 'matmul + NCCL 1.253 ms' above a printed answer that said 1.270 ms. The chart's
    title and ``--algorithm auto``'s answer (the notebook's cell 25, both) state the same two times."""
    import matplotlib

    matplotlib.use("Agg")
    measured, machine, one = model.load_inputs(*(os.path.join(model.MEASURED, name)
                                                 for name in model.CHECKED_AGAINST[:2]))
    title = model.draw(shape, 8, machine, one).get_title()
    drawn = re.search(r"two_shot (\d+\.\d{3}) ms, matmul \+ NCCL (\d+\.\d{3}) ms", title)
    _, said = model.choose(shape, 8)   # (as the notebook asks it)
    printed = re.search(r"predicts two_shot (\d+\.\d{3}) ms against cuBLAS then NCCL (\d+\.\d{3}) ms", said)
    assert drawn and printed and drawn.groups() == printed.groups(), (title, said)


def test_few_rows_fixed_costs_follow_their_formulas_and_leave_the_checked_shape_out(tmp_path):
    import json

    gpu, machine = model.Gpu(), model.Machine(matmul_ms={})
    # torch.matmul where it was not measured: at 16 rows reading B decides, at 8192^3 the FLOPs.
    assert model.matmul_ms((16, 8192, 14336), gpu) == pytest.approx((16 * 14336 + 14336 * 8192 + 16 * 8192) * 2 / 4e9)
    costs = few_rows.FixedCosts(nccl_floor_us=40.0, two_shot_extra_us=30.0, matmul_floor_us=20.0)
    shape = (16, 8192, 1024)
    fused, sequential = few_rows.predict_few_rows(shape, 2, 0.02, costs, gpu, machine)
    assert fused == pytest.approx(max(model.two_shot_local_ms(shape, 0.02, 2, gpu), 16 * 8192 * 2 / 450e6) + 0.030)
    assert sequential == pytest.approx(0.02 + 0.040)   # 256 KiB: NCCL's floor, not its bytes
    big = (4096, 8192, 1024)
    assert few_rows.predict_few_rows(big, 8, 0.1, costs, gpu, machine)[1] == pytest.approx(
        0.1 + 2 * 7 / 8 * 4096 * 8192 * 2 / 270e6)   # 64 MiB at W = 8: its bytes, not the floor
    assert few_rows.predict_few_rows_unmeasured(shape, 2, costs, gpu, machine)[0] == 0.020   # the matmul floor
    # Leave one out: the left-out shape's own figures change nothing in its prediction.
    path = os.path.join(model.MEASURED, model.FEW_ROWS_RUN)
    with open(path) as f:
        run = json.load(f)
    rows = few_rows.few_rows_leave_one_out(path, gpu, machine)
    assert [r[0] for r in rows] == [tuple(r["shape"]) for r in run["results"]]
    for shape, costs, *_ in rows:   # each fit is the fit of the other shapes alone
        others = [r for r in run["results"] if tuple(r["shape"]) != shape]
        assert costs == few_rows.fit_fixed_costs(others, gpu, machine)
    run["results"][-1]["two_shot_ms"] *= 3
    run["results"][-1]["allreduce_ms"] *= 3
    changed = tmp_path / "run.json"
    changed.write_text(json.dumps(run))
    again = few_rows.few_rows_leave_one_out(str(changed), gpu, machine)
    assert again[-1][1] == rows[-1][1] and again[-1][3] == rows[-1][3] and again[-1][2] == 3 * rows[-1][2]


def test_the_all_reduce_model_fits_the_measured_two_gpu_run_and_scales_by_its_rules():
    """Issue 50: the all-reduce model fits the 2-GPU run it is fitted on (within 30 % at every measured size,
    10 % at 64 MiB and up, where bandwidth decides), and predicts W = 4 and 8 by its stated rules: NCCL's ring
    latency grows as W - 1, one-shot's bytes as W - 1, two-shot's as 2 (W - 1) / W."""
    model = allreduce_model
    fits = model.fit(model.load())
    assert set(fits) == set(model.IMPLEMENTATIONS)
    for f in fits.values():
        assert all(abs(e) < 0.30 for e in f.errors.values()), (f.implementation, f.errors)
        assert all(abs(e) < 0.10 for mib, e in f.errors.items() if mib >= 64), (f.implementation, f.errors)
        assert 0 < f.latency_ms < 0.1 and 100 < f.gb_s < 900   # (us-scale latency, NVLink-scale bandwidth)
    nccl, one, two = fits["nccl"], fits["gemmar_one_shot"], fits["gemmar_two_shot"]
    assert abs(nccl.ms(2 ** -10, 8) / nccl.ms(2 ** -10, 2) - 7) < 0.01   # latency-bound: 7 ring steps of 1
    big = 1024
    assert abs((one.ms(big, 8) - one.latency_ms * model.latency_factor("direct", 8)) /
               (one.ms(big, 2) - one.latency_ms) - 7) < 1e-6
    assert abs((two.ms(big, 8) - two.latency_ms * model.latency_factor("direct", 8)) /
               (two.ms(big, 2) - two.latency_ms) - 1.75) < 1e-6
    rows = model.predictions(fits, [1, 256], (4, 8))
    assert [(r["world_size"], r["mib"]) for r in rows] == [(4, 1), (4, 256), (8, 1), (8, 256)]
    for r in rows:
        best = min(r[f"{n}_ms"] for n in ("symm_mem_two_shot", "nccl"))
        assert r["speed_vs_best_baseline"] == best / min(r["gemmar_two_shot_ms"], r["gemmar_one_shot_ms"])


def test_an_all_reduce_line_compares_with_the_best_baseline_that_moves_the_values():
    """`gemmar allreduce --baseline`'s line: the speed against the fastest baseline; at one rank NCCL returns
    without touching the buffer (0.016 ms for 256 MiB on an H100, against 0.390 for gemmar's copy in and out),
    so there it is shown but is not the baseline."""
    from gemmar.commands import allreduce_line

    times = dict(scheme="two_shot", ok=True, max_abs_diff=0.0, tolerance=0.04, identical=True, gemmar_ms=0.390,
                 nccl_ms=0.016, torch_symm_mem_ms=0.618, torch_symm_mem_one_shot_ms=0.763)
    one, two = dict(times), dict(times)
    line = allreduce_line(one, "256 MiB bf16 x 1 ranks", "two_shot", 0.0, 1)
    assert "| NCCL 0.016 ms" in line and line.endswith("| 1.58x the speed of the best baseline (torch symm_mem two-shot)")
    assert abs(one["speed_vs_best_baseline"] - 0.618 / 0.390) < 1e-12
    line = allreduce_line(two, "256 MiB bf16 x 2 ranks", "two_shot", 2 ** 28, 2)
    assert line.endswith("| 0.04x the speed of the best baseline (NCCL)") and two["speed_vs_best_baseline"] < 0.05
