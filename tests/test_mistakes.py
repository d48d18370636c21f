"""The ring kernel's teaching mistakes, run for real: each one must actually go wrong, and the hang must
come back as a DeadlockError naming rank, tile and flag, with the cluster still usable afterwards."""

import time

import pytest
import torch

import gemmar
from inputs import random_inputs, reference


def wrong_by(result, A, B):
    return (result.C.double() - reference(A, B)).abs().max().item()


def test_forwarding_the_accumulator_is_right_for_two_ranks_only(clusters):
    A, B = random_inputs(32, 32, 48, torch.float32, seed=3)
    two = clusters(2).gemm_all_reduce(A, B, BLK_M=16, BLK_N=16, BLK_K=16, mistake="forward_accumulator")
    assert two.ok and wrong_by(two, A, B) < 1e-3
    three = clusters(3).gemm_all_reduce(A, B, BLK_M=16, BLK_N=16, BLK_K=16, mistake="forward_accumulator")
    assert not three.ok and wrong_by(three, A, B) > 1.0


def test_hang_becomes_deadlock_error_naming_rank_tile_and_flag(clusters):
    cluster = clusters(2)   # two ranks, so that the same test runs on a 2-GPU machine
    A, B = random_inputs(32, 16, 24, torch.float16, seed=4)
    start = time.monotonic()
    with pytest.raises(gemmar.DeadlockError) as info:
        cluster.gemm_all_reduce(A, B, BLK_M=16, BLK_N=16, BLK_K=16, mistake="wait_for_missing_message", timeout_s=2)
    assert time.monotonic() - start < 30
    waits = info.value.waits
    # Every rank ends up waiting for the one message too many (the last one of the launch is never sent).
    # Which step a rank is at when its watchdog fires depends on timing: a rank that gave up goes on and
    # sends, which can let a neighbour pass its first wait.
    assert sorted(w["rank"] for w in waits) == [0, 1]
    for w in waits:
        assert w["flag"] == "data_ready" and w["index"] == w["tile"] and w["expected"] == w["seen"] + 1
    # Launch 0 of two ranks: every receive waits for message 2 of one that sends 1. Which of the two tiles a
    # rank's watchdog fires on first is timing (on an H200 it has been either).
    assert all(w["tile"] in (0, 1) and w["expected"] == 2 for w in waits), waits
    assert "rank 0" in str(info.value) and "flag data_ready[" in str(info.value)
    # The same cluster runs the correct kernel right after.
    assert cluster.gemm_all_reduce(A, B, BLK_M=16, BLK_N=16, BLK_K=16, iterations=2).ok


@pytest.mark.parametrize("algorithm", ["two_shot", "one_shot"])
def test_reading_partials_before_their_flag_goes_wrong_with_a_late_rank(clusters, algorithm):
    # Rank 1 starts every launch 0.5-1 s late. The owner (one_shot: every rank) that skips the partial_ready
    # wait reads rank 1's partial before rank 1 has written it (zeros in the first launch): a wrong sum.
    A, B = random_inputs(32, 32, 48, torch.float32, seed=6)
    cluster = clusters(2)
    late = dict(algorithm=algorithm, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2, delay_rank=1, delay_us=1e6)
    wrong = cluster.gemm_all_reduce(A, B, mistake="skip_partial_wait", **late)
    assert not wrong.ok and wrong_by(wrong, A, B) > 1.0
    right = cluster.gemm_all_reduce(A, B, **late)     # the real kernel waits, and is right however late
    assert right.ok


def test_a_mistake_of_another_kernel_is_refused(clusters):
    A, B = random_inputs(32, 32, 48, torch.float16, seed=7)
    with pytest.raises(gemmar.UsageError, match="does not exist in 'two_shot'"):
        clusters(2).gemm_all_reduce(A, B, algorithm="two_shot", mistake="forward_accumulator")


def test_a_mistake_is_a_part_swapped_never_a_branch_of_a_kernel():
    """One mechanism for teaching mistakes and puzzles' answers: a mistake names functions that take some of
    the kernel's parts' places (kernels/mistakes.py); no kernel file holds a branch for one."""
    import pathlib

    from gemmar.algorithms import get
    from gemmar.kernels import mistakes
    from gemmar.kernels.spec import AlgorithmSpec, Done, Phase

    kernels = pathlib.Path(gemmar.__file__).parent / "kernels"
    for path in kernels.glob("*.py"):
        text = path.read_text()
        assert "MISTAKE" not in text and "mistake_index" not in text, path.name
    for name, swaps in {"ring": {"forward_accumulator": "reduce_step", "skip_slot_free_wait": "slot_free_wait",
                                 "wait_for_missing_message": "data_ready_wait"},
                        "two_shot": {"skip_partial_wait": "partial_wait"},
                        "one_shot": {"skip_partial_wait": "partial_wait"}}.items():
        spec = get(name)
        assert spec.mistakes == ("none",) + tuple(swaps)
        for mistake, part in swaps.items():
            parts = spec.parts_for(spec.mistake_swaps(mistake))   # a mistake is a named set of parts
            assert parts[part] is spec.mistake_parts[mistake][part] is not spec.parts[part].reference
            assert parts[part].fn.__module__ == mistakes.__name__
            # every other part stays the kernel's own
            assert all(parts[p] is spec.parts[p].reference for p in spec.parts if p != part)
    # A spec's mistake must swap parts it has.
    with pytest.raises(gemmar.UsageError, match="mistake_parts must map each mistake's name"):
        AlgorithmSpec(name="x", summary="", buffers=len, launches=len, output=len, phases=(Phase(1, "a", "gemm"),),
                      done=Done("a"), mistake_parts={"skip": {"no_such_part": mistakes.skip_the_wait}})
