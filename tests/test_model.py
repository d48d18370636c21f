"""The performance model's arithmetic and its refusal to predict when it does not reproduce what was measured
(its figures are in BENCHMARKS.md, from benchmarks/model.py: none is asserted here)."""

import os

import pytest

from gemmar.analysis import model

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
    measured, machine, one = model.load_inputs(os.path.join(DATA, "h200-bench.json"),
                                                os.path.join(DATA, "h200x1-bench-2026-12-02.json"))
    assert set(measured) == set(machine.matmul_ms) == set(one.ratio["two_shot"])
    assert set(measured[SHAPE]) == {"atomics", "ring", "sequential"}
