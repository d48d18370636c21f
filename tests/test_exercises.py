"""Every notebook exercise check, both ways: the right answer passes; a wrong one is told what is wrong,
and the message never gives the answer away."""

import os
from types import SimpleNamespace

import pytest

from gemmar import RunConfig, Trace
from gemmar import exercises

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def test_tile_owner():
    assert exercises.check_tile_owner(None, None).startswith("fill in")
    assert exercises.check_tile_owner(2, 3).startswith("right!")          # tile (3, 1) is tile 11: program 2, turn 3
    wrong = exercises.check_tile_owner(1, 2)
    assert wrong.startswith("not quite: program 1 on turn 2 computes tile (1, 3)") and "program 2" not in wrong
    assert "there is no turn 9" in exercises.check_tile_owner(1, 9)
    assert "numbered 0 to 2" in exercises.check_tile_owner(7, 0)


def test_total_pushes():
    trace = Trace.load(os.path.join(DATA, "cpu-atomics-4ranks-48x40x40.trace.json.gz"))   # 9 tiles, 4 ranks
    assert exercises.check_total_pushes(lambda tiles, W: None, trace) == "fill in total_pushes"
    assert exercises.check_total_pushes(lambda tiles, W: tiles * W * W, trace).startswith("right!")
    wrong = exercises.check_total_pushes(lambda tiles, W: tiles * (W - 1), trace)   # forgets the own C
    assert wrong.startswith("not quite: for 9 tiles and 4 ranks your formula gives 27") and "144" not in wrong


def test_ring_wait():
    assert exercises.check_ring_wait(lambda e, s, W: None) == "fill in waited_for"
    assert exercises.check_ring_wait(lambda e, s, W: e * (W - 1) + s + 1).startswith("right!")
    wrong = exercises.check_ring_wait(lambda e, s, W: e * W + s + 1)     # counts W messages per launch
    assert wrong.startswith("not quite: in launch e=1, step s=0 with W=2 ranks your formula gives 3,")
    assert "(W - 1)" not in wrong and "+ 1" not in wrong


@pytest.mark.parametrize("change,verdict", [
    ({}, "that is the starting configuration"),
    ({"num_sms": 4}, "found one!"),          # the recorded trace waits less than it communicates
    ({"algorithm": "atomics"}, "not yet: the last run is atomics"),
])
def test_waiting_beats_comm(change, verdict):
    trace = Trace.load(os.path.join(DATA, "cpu-ring-4ranks-48x40x40.trace.json.gz"))
    start = RunConfig(m=48, n=40, k=40, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3, world_size=4, algorithm="ring")
    last = RunConfig(**{**start.to_dict(), **change})
    explorer = SimpleNamespace(first_config=start, result=SimpleNamespace(config=last, trace=trace))
    assert exercises.check_waiting_beats_comm(explorer).startswith(verdict)
    assert exercises.check_waiting_beats_comm(SimpleNamespace(first_config=start)) == "press Run first"


def test_worst_wait():
    rows = [dict(trace="ring-8192", wait_per_program_us=50.0), dict(trace="atomics-8192", wait_per_program_us=0.0)]
    assert exercises.check_worst_wait("ring-8192", rows).startswith("right!")
    wrong = exercises.check_worst_wait("atomics-8192", rows)
    assert wrong.startswith("not quite: atomics-8192 waits 0.0 us") and "ring-8192" not in wrong
    assert "is not in the table" in exercises.check_worst_wait("tree", rows)
