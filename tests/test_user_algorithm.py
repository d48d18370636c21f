"""A fourth algorithm defined outside gemmar (tests/one_shot_push.py, written with the public device, trace
and spec APIs only) runs through the same call as the built-in ones: checked against the reference on every
rank after every launch, traced, drawn, replayed and exported with its own phase names."""

import json

import pytest
import torch

import gemmar
import one_shot_push
from gemmar import algorithms
from inputs import random_inputs


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_a_users_algorithm_runs_checked_and_traced(clusters, world_size, tmp_path):
    cluster = clusters(world_size)
    A, B = random_inputs(40, 36, 20 * world_size + 3, torch.bfloat16, seed=world_size)   # uneven K-slices
    result = cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3,
                                     iterations=3, trace=True)
    assert result.ok and result.config.algorithm == "one_shot_push"
    assert all(len(rank.max_abs_diff) == 3 for rank in result.ranks)             # every launch checked
    assert all(torch.equal(rank.C, result.C) for rank in result.ranks)           # rank-order sum: same bits
    trace = result.trace
    assert set(trace.events["kind"]) == {"gemm", "push", "arrival_wait", "sum", "store"}
    assert len(trace.events) == 3 * trace.expected_event_count() == 3 * world_size * 9 * 5
    states = trace.replay_states()
    assert all((grid == 3).all() for grid in states[-1]["tiles"])               # its done rule: its store
    waits = [w for s in states for w in s["waiting"]]
    if world_size > 1:
        assert waits and all("waits for arrived (all" in w for w in waits)
    # Saved, it reads back without the spec (the protocol travels in the file), and draws and exports.
    path = trace.save(tmp_path / "user.trace.json")
    loaded = gemmar.Trace.load(path)
    assert list(loaded.events["kind"]) == list(trace.events["kind"])
    loaded.gantt(path=tmp_path / "gantt.png")
    loaded.to_perfetto(tmp_path / "p.json")
    perfetto = json.loads((tmp_path / "p.json").read_text())
    assert any(e.get("name", "").startswith("arrival_wait") for e in perfetto["traceEvents"])


def test_a_users_algorithm_is_checked_like_the_built_in_ones(clusters):
    cluster = clusters(2)
    A, B = random_inputs(32, 32, 40, torch.float16)
    with pytest.raises(gemmar.UsageError, match="mistake 'skip' does not exist in 'one_shot_push': use one of none"):
        cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC, mistake="skip", BLK_M=16, BLK_N=16, BLK_K=16)
    with pytest.raises(gemmar.UsageError, match="wire_dtype=fp16 is not allowed with one_shot_push"):
        cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC, wire_dtype="fp16", BLK_M=16, BLK_N=16, BLK_K=16)
    assert "one_shot_push" in algorithms.names()   # registered by its first use
    with pytest.raises(gemmar.UsageError, match="taken by a built-in algorithm"):
        gemmar.register_algorithm(gemmar.AlgorithmSpec(**{**vars(one_shot_push.SPEC), "name": "ring"}))
    with pytest.raises(gemmar.UsageError, match="output is a lambda; define it with def"):
        cluster.gemm_all_reduce(A, B, algorithm=gemmar.AlgorithmSpec(**{**vars(one_shot_push.SPEC), "name": "lam",
                                                                        "output": lambda b, e: b.C}))
