"""A fourth algorithm defined outside gemmar (tests/one_shot_push.py, written with the public device, trace
and spec APIs only) runs through the same call as the built-in ones: checked against the reference on every
rank after every launch, traced, drawn, replayed and exported with its own phase names."""

import json
import re

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


def test_a_store_past_cs_edge_is_named_by_default_on_cpu_ranks(clusters):
    """Workshop dry run 3: a store whose row mask is built from the column offsets writes an edge tile's rows
    past C (50 x 40) into the next heap buffer; C comes out right, so only the bounds check sees it. A user's
    algorithm on cpu ranks runs with it by default; sanitize=False turns it off (and then C is 'right')."""
    import re
    import time

    cluster = clusters(2)
    A, B = random_inputs(50, 40, 64, torch.bfloat16, seed=3)
    started = time.monotonic()
    with pytest.raises(gemmar.HeapBoundsError) as found:
        cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC_ROWS_MASKED_BY_COLUMNS, BLK_M=16, BLK_N=16,
                                BLK_K=16, num_sms=2)
    assert time.monotonic() - started < 15
    assert re.search(r"a write at `tl\.store\(.*\)` \(store_tile_rows_masked_by_columns\) reaches element 2000 \(row 50, column 0; rows are 0 to 49\) of C "
                     r"\(float32\[50, 40\], 2000 elements\) on rank \d's heap, past its end", str(found.value)), found.value
    unchecked = cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC_ROWS_MASKED_BY_COLUMNS, BLK_M=16,
                                        BLK_N=16, BLK_K=16, num_sms=2, sanitize=False)
    assert unchecked.ok   # (why the check must be on: the values alone say nothing is wrong)


def test_a_wrong_wait_in_a_users_algorithm_is_named_within_15_s():
    """Workshop dry run 3: notebook 7's cluster (timeout_s=10) names a wait for an arrival that never comes, with
    rank, tile and flag, within 15 s (the default 60 s was a minute of silence)."""
    import time

    with gemmar.Cluster(world_size=2, backend="cpu", timeout_s=10) as cluster:
        A, B = random_inputs(32, 32, 32, torch.bfloat16, seed=4)
        started = time.monotonic()
        with pytest.raises(gemmar.DeadlockError, match=r"rank \d \(program \d\) waited on tile \d+ for flag arrived\[\d+\] >= 3 but saw 2") \
                as found:
            cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC_WAITING_FOR_ONE_TOO_MANY, BLK_M=16, BLK_N=16,
                                    BLK_K=16, num_sms=2)
        assert time.monotonic() - started < 15, found.value


def test_partials_rounded_to_fp16_are_a_mismatch_named_as_such(clusters, capsys):
    """Workshop dry run 4: notebook 7's kernel with its pulled partials rounded to fp16 passed (0.0087 against a
    tolerance of 0.0091, where the right kernel errs by 2e-6). On cpu ranks the tolerance is the bound no correct
    fp32 kernel exceeds (problem.fp32_sum_bound); the right kernel passes it, the rounded one fails, and the
    verbose line says what rounding its error is the size of."""
    cluster = clusters(3)
    torch.manual_seed(0)
    A, B = torch.randn(48, 90, dtype=torch.bfloat16), torch.randn(90, 32, dtype=torch.bfloat16)   # notebook 7's
    settings = dict(BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2, sanitize=False)
    right = cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC, **settings)
    rounded = cluster.gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC_ROUNDING_THE_PARTIALS_TO_FP16, verbose=True,
                                      **settings)
    tolerance = right.ranks[0].tolerance
    assert right.ok and right.max_abs_diff < tolerance / 100 and tolerance < 1e-3, (right.max_abs_diff, tolerance)
    assert not rounded.ok and rounded.max_abs_diff > 5 * tolerance, (rounded.max_abs_diff, tolerance)
    said = capsys.readouterr().out
    assert re.search(r"MISMATCH: max\|C - ref\| = \S+ over 1 iteration\(s\) \(tolerance \S+\): about what rounding "
                     r"to fp16 costs .*was a partial or a sum rounded to fp16 on its way into C\?", said), said


def test_a_wait_on_another_tiles_flag_is_named_by_the_flag_it_polled_and_its_line(clusters):
    """Workshop dry run 4: `wait(ready + (tile_id + 1) % tiles, ...)` was reported as a wait on ready[tile_id],
    the right flag (the report printed the index argument). Now the address polled is named, by buffer and
    index, with the line of the wait."""
    A, B = random_inputs(32, 32, 32, torch.bfloat16, seed=4)   # 2 x 2 tiles, two programs per rank
    with pytest.raises(gemmar.DeadlockError) as found:
        clusters(2).gemm_all_reduce(A, B, algorithm=one_shot_push.SPEC_WAITING_ON_THE_NEXT_TILES_FLAG, BLK_M=16,
                                    BLK_N=16, BLK_K=16, num_sms=2, timeout_s=2)
    said = str(found.value)
    match = re.search(r"waited on tile (\d) for flag arrived\[(\d)\] \(the address it polled; its wait names "
                      r"arrived\[(\d)\]\) >= 2 but saw \d, at `device\.wait_at_least\(arrived \+ \(tile_id \+ "
                      r"WAIT_SHIFT\) % total_tiles, .*` \(one_shot_push_kernel\)", said)
    assert match, said
    tile, polled, named = map(int, match.groups())
    assert named == tile and polled == (tile + 1) % 4, said
    assert all(w["waited_on"].startswith("arrived[") and w["index"] == w["tile"] for w in found.value.waits)
