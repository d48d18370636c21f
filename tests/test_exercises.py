"""Every notebook exercise check, both ways: the right answer passes; a wrong one is told what is wrong,
and the message never gives the answer away."""

import json
import os
import re
import sys
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
    ({"num_sms": 4}, "not yet: waiting"),          # the same recorded trace: as long as the start's
    ({"algorithm": "atomics"}, "not yet: the last run is atomics"),
])
def test_less_waiting_on_a_recorded_trace(change, verdict):
    """(A live run that finds one is in tests/test_explorer.py.)"""
    trace = Trace.load(os.path.join(DATA, "cpu-ring-4ranks-48x40x40.trace.json.gz"))
    start = RunConfig(m=48, n=40, k=40, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3, world_size=4, algorithm="ring")
    last = RunConfig(**{**start.to_dict(), **change})
    first = SimpleNamespace(config=start, trace=trace)
    explorer = SimpleNamespace(first_config=start, first_result=first, result=SimpleNamespace(config=last, trace=trace))
    said = exercises.check_less_waiting(explorer)
    assert said.startswith(verdict), said
    if verdict == "not yet: waiting":
        assert "Hint: every tile is handed from rank to rank W - 1 times" in said
    assert exercises.check_less_waiting(SimpleNamespace(first_config=start, first_result=first)) == "press Run first"
    assert exercises.check_less_waiting(SimpleNamespace(first_config=start, first_result=None)).startswith(
        "run the starting configuration first")


def test_worst_wait():
    rows = [dict(trace="ring-8192", wait_per_program_us=50.0), dict(trace="atomics-8192", wait_per_program_us=0.0)]
    assert exercises.check_worst_wait("ring-8192", rows).startswith("right!")
    wrong = exercises.check_worst_wait("atomics-8192", rows)
    assert wrong.startswith("not quite: atomics-8192 waits 0.0 us") and "ring-8192" not in wrong
    assert "is not in the table" in exercises.check_worst_wait("tree", rows)


def test_right_ranks():
    config = RunConfig(world_size=3, delay_rank=1, delay_us=1.0)
    ranks = [SimpleNamespace(rank=r, ok=r == 1) for r in range(3)]
    result = SimpleNamespace(ranks=ranks, config=config)
    assert exercises.check_right_ranks(None, result).startswith("fill in")
    assert exercises.check_right_ranks({1}, result).startswith("right! rank 1 started late")
    wrong = exercises.check_right_ranks({0, 2}, result)
    assert wrong.startswith("not quite: look at the per-rank lines above (1 rank(s) matched") and "{1}" not in wrong


# The puzzles: the stub in the notebook's cell (tagged "puzzle") fails its check, with a message that says
# where and how; the solution in instructors/solutions.py passes. Both run for real, in the kernel, on a cluster.
NOTEBOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "notebooks")
INSTRUCTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "instructors")   # solutions.py
PUZZLES = {   # notebook -> (check, the function the solution file defines, what the stub's message must say)
    "01_persistent_gemm": ("check_tile_coords", "tile_coords",
                           "not quite: C is right (every tile once), but not in grouped order"),
    "02_atomic_accumulation": ("check_push_partial", "push_partial", "pushes of that tile returned rank(s) 0, 0, 0"),
    "03_ring_lock_handoff": ("check_reduce_step", "reduce_step", "rank 0's C has rank 1's partial 0 times"),
    "06_two_shot": ("check_sum_partials", "sum_partials", "rank 0's C has rank 1's partial 0 times"),
}


def _module_from(path, source):
    import importlib.util

    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def puzzle_stub(notebook, tmp_path):
    """The @triton.jit function the notebook's puzzle cell defines, defined from that cell's source."""
    import json

    cells = json.load(open(os.path.join(NOTEBOOKS, notebook + ".ipynb")))["cells"]
    puzzle = [c for c in cells if "puzzle" in c["metadata"].get("tags", [])]
    assert len(puzzle) == 1, f"{notebook} has {len(puzzle)} cells tagged 'puzzle'"
    module = _module_from(tmp_path / f"stub_{notebook[:2]}.py", "".join(puzzle[0]["source"]))
    return next(v for k, v in vars(module).items() if k.startswith("my_"))


@pytest.mark.parametrize("world_size", [3])
@pytest.mark.parametrize("notebook", sorted(PUZZLES))
def test_puzzle_fails_on_stub_and_passes_on_solution(clusters, world_size, notebook, tmp_path):
    check_name, solved_name, says = PUZZLES[notebook]
    check = getattr(exercises, check_name)
    cluster = clusters(world_size)
    stub = check(cluster, puzzle_stub(notebook, tmp_path))
    assert stub.startswith("not quite:") and says in stub, stub
    assert stub.result is not None and stub.result.trace is not None   # the wrong run, for a closer look
    sys.path.insert(0, INSTRUCTORS)
    try:
        import solutions
    finally:
        sys.path.remove(INSTRUCTORS)
    assert check(cluster, getattr(solutions, solved_name)).startswith("right!")

ALSO_RIGHT = '''
import triton
import triton.language as tl
from gemmar.kernels import device


@triton.jit
def tile_coords_with_python_min(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    group = tile_id // (GROUP_SIZE_M * num_pid_n)
    first_row = group * GROUP_SIZE_M
    rows = min(num_pid_m - first_row, GROUP_SIZE_M)   # Python's min, not tl.minimum
    within = tile_id - group * GROUP_SIZE_M * num_pid_n   # no %
    return first_row + within % rows, within // rows


@triton.jit
def tile_coords_with_where(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_row = (tile_id // tiles_per_group) * GROUP_SIZE_M
    short = num_pid_m - first_row < GROUP_SIZE_M
    rows = tl.where(short, num_pid_m - first_row, GROUP_SIZE_M)
    return first_row + (tile_id % tiles_per_group) % rows, (tile_id % tiles_per_group) // rows


@triton.jit
def push_partial_backwards(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank - step + world_size) % world_size   # the ring the other way round
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer


@triton.jit
def push_partial_without_modulo(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = rank + step
    if peer >= world_size:   # wraps round by hand
        peer -= world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask)
    return peer


@triton.jit
def reduce_step_in_other_words(total, received):
    payload = received
    new_total = received + total
    return new_total, payload


@triton.jit
def sum_partials_with_a_while_loop(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    total = tl.zeros(slot.shape, tl.float32)
    source = 0
    while source < world_size:
        partial = tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE)
        total = total + partial.to(tl.float32)
        source += 1
    return total


@triton.jit
def sum_partials_own_first(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    # rank 0's first whoever the owner is: the same order on every owner
    total = tl.load(device.translate(slot, rank, 0, heap_bases)).to(tl.float32)
    for source in range(1, world_size):
        total += tl.load(device.translate(slot, rank, source, heap_bases)).to(tl.float32)
    return total
'''


@pytest.mark.parametrize("world_size", [3])
@pytest.mark.parametrize("check_name,answer", [
    ("check_tile_coords", "tile_coords_with_python_min"), ("check_tile_coords", "tile_coords_with_where"),
    ("check_push_partial", "push_partial_backwards"), ("check_push_partial", "push_partial_without_modulo"),
    ("check_reduce_step", "reduce_step_in_other_words"),
    ("check_sum_partials", "sum_partials_with_a_while_loop"), ("check_sum_partials", "sum_partials_own_first"),
])
def test_right_answers_written_differently_are_right(clusters, world_size, check_name, answer, tmp_path):
    """Issue 37: a right answer need not be the solution's text: Python's min, tl.where, a while loop, the
    ring the other way round, a wrap by hand are all right, and the checks run them for real and say so."""
    module = _module_from(tmp_path / f"also_right_{answer}.py", ALSO_RIGHT)
    said = getattr(exercises, check_name)(clusters(world_size), getattr(module, answer))
    assert said.startswith("right!"), said


WRONG = '''
import triton
import triton.language as tl
from gemmar.kernels import device


@triton.jit
def no_short_group(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    first_row = (tile_id // (GROUP_SIZE_M * num_pid_n)) * GROUP_SIZE_M
    within = tile_id % (GROUP_SIZE_M * num_pid_n)
    return first_row + within % GROUP_SIZE_M, within // GROUP_SIZE_M


@triton.jit
def wrong_arguments(C_tile, acc, mask, step, rank, world_size, heap_bases):
    device.atomic_add(C_tile, acc, rank, heap_bases, mask=mask)
    return rank


@triton.jit
def fifth_rank(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask & (step > 0))
    return peer


def not_jitted(total, received):
    return total + received, received


@triton.jit
def three_arguments(total, received, extra):
    return total + received, received
'''


@pytest.mark.parametrize("world_size", [3])
def test_puzzle_checks_say_what_is_wrong(clusters, world_size, tmp_path):
    wrong = _module_from(tmp_path / "wrong_parts.py", WRONG)
    cluster = clusters(world_size)
    said = exercises.check_tile_coords(cluster, wrong.no_short_group)   # the classic: the last group not clamped
    assert said.startswith("not quite: tile id 22 went to (pid_m, pid_n) = (6, 0), outside the grid"), said
    said = exercises.check_push_partial(cluster, wrong.wrong_arguments)   # interpreted: "failed at", compiled:
    assert re.fullmatch(r"not yet: your push_partial (failed|did not compile) at `device\.atomic_add\(C_tile, acc, "
                        r"rank, heap_bases, mask=mask\)`: TypeError: .*missing .* argument.*'heap_bases'.*", said), said
    said = exercises.check_push_partial(cluster, wrong.fifth_rank)   # step 0 (its own C) masked off
    assert "rank 0's C has rank 0's partial 0 times" in said and said.result.ok is False, said
    assert exercises.check_reduce_step(cluster, wrong.not_jitted) == \
        "not yet: reduce_step must be a @triton.jit function, got a plain Python function: put @triton.jit on " \
        "the line above its def"
    assert exercises.check_reduce_step(cluster, wrong.three_arguments).startswith(
        "not yet: reduce_step takes 2 arguments (total, received) and returns (total, payload); three_arguments "
        "takes 3")


def test_parts_are_checked_before_anything_runs():
    from gemmar.algorithms import get
    from gemmar.errors import UsageError
    from gemmar.kernels.ring import reduce_step
    from gemmar.runtime.shipping import ship_parts as part_sources

    with pytest.raises(UsageError, match="the ring kernel has no part 'swizzle': its parts are tile_coords, reduce_step"):
        part_sources({"swizzle": reduce_step}, get("ring"))
    with pytest.raises(UsageError, match="the atomics kernel has no part 'reduce_step': its parts are tile_coords, "
                                         "push_partial"):
        part_sources({"reduce_step": reduce_step}, get("atomics"))
    with pytest.raises(UsageError, match="parts must be a dict"):
        part_sources([reduce_step], get("ring"))
    # gemmar's own function travels as an import, not as source
    shipped = part_sources({"reduce_step": reduce_step}, get("ring"))["reduce_step"]
    assert shipped["function"] == ("gemmar.kernels.puzzle_parts", "reduce_step") and shipped["sources"] == {}


HELPER = '''
import triton
import triton.language as tl


@triton.jit
def rows_in_group(first_pid_m, num_pid_m, GROUP_SIZE_M: tl.constexpr):
    return tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)


@triton.jit
def tile_coords_with_a_helper(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (tile_id // tiles_per_group) * GROUP_SIZE_M
    rows = rows_in_group(first_pid_m, num_pid_m, GROUP_SIZE_M)
    within = tile_id % tiles_per_group
    return first_pid_m + within % rows, within // rows
'''


@pytest.mark.parametrize("world_size", [2])
def test_a_part_that_calls_a_helper_of_the_same_cell_runs(clusters, world_size, tmp_path):
    # The helper's source travels with the part (a NameError on the ranks before).
    helped = _module_from(tmp_path / "helped.py", HELPER)
    assert exercises.check_tile_coords(clusters(world_size), helped.tile_coords_with_a_helper).startswith("right!")


@pytest.mark.slow   # (out of the fast tier: README, "Run the tests")
def test_a_puzzle_check_starts_a_stopped_cluster(capsys):
    """After Run All the notebook's last cell has stopped the cluster; the participant's next try still runs.
    (A cluster of its own: the shared ones carry the tests' helpers on their engines.)"""
    import gemmar
    from gemmar.kernels.gemm import tile_coords

    cluster = gemmar.Cluster(world_size=1, backend=os.environ.get("GEMMAR_TEST_BACKEND", "cpu"))
    try:
        cluster.stop()
        assert exercises.check_tile_coords(cluster, tile_coords).startswith("right!")
        assert "(the cluster was stopped: starting 1 rank(s) again)" in capsys.readouterr().out
        assert cluster.running
    finally:
        cluster.stop()


SWAPPED = '''
import triton
from gemmar.kernels import device


@triton.jit
def swapped_ranks(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank + step) % world_size
    device.atomic_add(C_tile, acc, peer, rank, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer
'''


@pytest.mark.slow   # (out of the fast tier: README, "Run the tests")
def test_a_part_that_crashes_its_ranks_is_explained_and_the_next_check_runs(tmp_path, capsys):
    """The classic Iris slip (from_rank and to_rank swapped): on cpu the sanitizer stops the stray write and says
    which rank from_rank must be; compiled, the engines crash, the participant is told the likely cause, and the
    right answer passes next with no manual restart (a cluster of its own)."""
    import gemmar

    sys.path.insert(0, INSTRUCTORS)
    try:
        import solutions
    finally:
        sys.path.remove(INSTRUCTORS)
    wrong = _module_from(tmp_path / "swapped.py", SWAPPED)
    with gemmar.Cluster(world_size=3, backend=os.environ.get("GEMMAR_TEST_BACKEND", "cpu")) as cluster:
        said = exercises.check_push_partial(cluster, wrong.swapped_ranks)
        if cluster.backend == "cpu":   # the sanitizer stops the write before it lands, and names the cause
            assert re.fullmatch(r"not yet: your push_partial failed: HeapBoundsError: "
                                r"rank \d, program \d: an atomic at `device\.atomic_add\(.*\)` \(swapped_ranks\) translates a "
                                r"pointer from rank \d to rank \d, but the pointer is in rank \d's heap, not rank \d's, "
                                r"so the address lands on no heap: the caller is rank \d, so from_rank must be \d "
                                r"\(data flows from from_rank to to_rank\)", said), said
            assert exercises.check_push_partial(cluster, solutions.push_partial).startswith("right!")
            return
        assert said.startswith("not yet: rank"), said
        if "killed by SIGSEGV" in said or "killed by SIGBUS" in said:
            assert "reached an address outside every rank's heap: look at the order of from_rank and to_rank" in said
        assert said.endswith("The next check starts fresh ranks by itself"), said
        assert exercises.check_push_partial(cluster, solutions.push_partial).startswith("right!")
        assert "(the last check's ranks crashed: starting 3 rank(s) again)" in capsys.readouterr().out


EDGES_AND_RANKS = '''
import triton
from gemmar.kernels import device


@triton.jit
def no_mask(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, sem="relaxed", scope="sys")
    return peer


@triton.jit
def no_modulo(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = rank + step
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer


@triton.jit
def backwards_below_zero(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank - step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer
'''


def test_a_push_without_its_mask_or_its_modulo_is_told_its_own_cause(clusters, tmp_path):
    """Issue 37: the check's C has edge tiles (40 x 44 in 16 x 16 tiles), so a push without ``mask=`` writes past
    C's edge and is stopped there, told to mask; a peer without ``% world_size`` asks for a rank that does not
    exist, and is told so. (The right answer passes in test_puzzle_fails_on_stub_and_passes_on_solution.)"""
    if os.environ.get("GEMMAR_TEST_BACKEND", "cpu") != "cpu":
        pytest.skip("the sanitizer's bounds check (cpu ranks) names these causes")
    wrong = _module_from(tmp_path / "edges.py", EDGES_AND_RANKS)
    said = exercises.check_push_partial(clusters(3), wrong.no_mask)
    assert "past its end" in said and said.endswith("in an edge tile the rows and columns past C's edge must be "
                                                    "masked off (mask=)"), said
    said = exercises.check_push_partial(clusters(3), wrong.no_modulo)
    assert re.search(r"HeapBoundsError: rank \d, program \d asked for rank 3 at .*: ranks are 0 to 2 "
                     r"\(world_size=3\)", said), said
    said = exercises.check_push_partial(clusters(3), wrong.backwards_below_zero)   # (rank - step) % W: -1 at rank 0
    assert re.search(r"asked for rank -\d at .*: ranks are 0 to 2 \(world_size=3\)\. \(In Triton, as in C, % keeps "
                     r"the sign of its left side", said), said

RETURNS_ANOTHER_RANK = '''
import triton
import triton.language as tl

from gemmar.kernels import device


@triton.jit
def returns_the_step(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return step   # every C right, but the trace and the done rule would say the push went to rank `step`
'''


def test_a_push_that_returns_another_rank_than_it_pushed_to_is_wrong(clusters, tmp_path):
    """Workshop dry run 3: C is right, so the values alone passed it; the returned rank is what the trace and the
    replay's done rule record, so it is checked against where the sanitizer saw the atomic add land."""
    if os.environ.get("GEMMAR_TEST_BACKEND", "cpu") != "cpu":
        pytest.skip("the sanitizer's record of where each add went (cpu ranks) decides this")
    wrong = _module_from(tmp_path / "returns.py", RETURNS_ANOTHER_RANK)
    said = exercises.check_push_partial(clusters(3), wrong.returns_the_step)
    assert re.fullmatch(r"not quite: every rank's C is right, but your push_partial returned rank \d for a push that "
                        r"went to rank \d \(rank \d, tile \(\d+, \d+\), step \d\): return the rank whose C you "
                        r"added into, .*", said), said


ENDLESS = '''
import triton
import triton.language as tl


@triton.jit
def endless(total, received):
    spins = tl.zeros((), tl.int32)
    while spins >= 0:   # never false: a loop that waits on no flag, so no watchdog sees it
        spins = spins * 1
    return total + received, received
'''


@pytest.mark.slow   # (out of the fast tier: README, "Run the tests")
def test_a_part_that_never_ends_is_stopped_in_seconds_and_said_plainly(tmp_path, capsys):
    """Issue 37: a loop without a wait is stopped within ~10 s of the launch it stalls, in words a participant
    reads, and the next check starts fresh ranks without calling them crashed (a cluster of its own)."""
    import time

    import gemmar

    sys.path.insert(0, INSTRUCTORS)
    try:
        import solutions
    finally:
        sys.path.remove(INSTRUCTORS)
    wrong = _module_from(tmp_path / "endless.py", ENDLESS)
    with gemmar.Cluster(world_size=3) as cluster:
        start = time.monotonic()
        said = exercises.check_reduce_step(cluster, wrong.endless)
        took = time.monotonic() - start
        assert said == (f"not yet: a launch with your reduce_step ran for {exercises.CHECK_LAUNCH_DEADLINE_S} s "
                        f"without ending (a loop that never stops?), so its ranks were stopped. The next check "
                        f"starts fresh ranks by itself"), said
        assert took < exercises.CHECK_LAUNCH_DEADLINE_S + 15, took
        assert exercises.check_reduce_step(cluster, solutions.reduce_step).startswith("right!")
        assert "(the last check's ranks were stopped in a launch that did not end: starting 3 rank(s) again)" in \
            capsys.readouterr().out


@pytest.mark.slow   # (out of the fast tier: README, "Run the tests")
def test_after_a_deadlock_the_next_call_finds_its_ranks_up(tmp_path, capfd):
    """Issue 61: a wrong wait cost 22-24 s in the cell, twice the 10 s deadline, waiting for ranks to start. A wait
    the watchdog names (DeadlockError) leaves the ranks running, and the next call reuses them; a launch stopped for
    not ending leaves none, and in interactive use (restart_early, on in a notebook) fresh ones start at once, in
    the background, so that the next call finds them up and says why they are new."""
    import torch

    import gemmar
    from inputs import wait_until

    wrong = _module_from(tmp_path / "endless_two.py", ENDLESS)
    A, B = torch.randn(32, 40), torch.randn(40, 32)
    with gemmar.Cluster(world_size=2, timeout_s=1) as cluster:
        cluster.restart_early = True
        first = cluster.run(os.getpid)
        with pytest.raises(gemmar.DeadlockError):
            cluster.gemm_all_reduce(A, B, algorithm="ring", BLK_M=16, BLK_N=16, BLK_K=16,
                                    mistake="wait_for_missing_message")
        assert cluster.running and cluster.run(os.getpid) == first   # the same ranks, still up
        with pytest.raises(gemmar.RankDiedError, match="finished no launch"):
            cluster.gemm_all_reduce(A, B, algorithm="ring", BLK_M=16, BLK_N=16, BLK_K=16, launch_deadline_s=2,
                                    parts={"reduce_step": wrong.endless})
        # No call since: fresh ranks come up by themselves.
        assert wait_until(lambda: cluster.running, 180), "no ranks were started after the hang"
        capfd.readouterr()
        result = cluster.gemm_all_reduce(A, B, algorithm="ring", BLK_M=16, BLK_N=16, BLK_K=16)
        assert result.ok and cluster.restart_reason is None
        again = cluster.run(os.getpid)
        assert not set(again) & set(first)
        said = capfd.readouterr().err
        assert "[gemmar] restarted the cluster: in its last run" in said and "restarting" not in said, said


RING_ORDER = '''
import triton
import triton.language as tl
from gemmar.kernels import device


@triton.jit
def ring_order_sum(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    total = tl.zeros(slot.shape, tl.float32)
    for step in range(world_size):   # own rank first: every partial once, but not in rank order
        source = (rank + step) % world_size
        total += tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE).to(tl.float32)
    return total


@triton.jit
def sum_in_the_wire_dtype(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    total = tl.load(device.translate(slot, rank, 0, heap_bases), cache_modifier=PEER_CACHE)
    for source in range(1, world_size):   # rank order, but added in the partials' own dtype (no .to(tl.float32))
        total += tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE)
    return total.to(tl.float32)
'''


@pytest.mark.parametrize("world_size", [3])
def test_the_owners_sum_must_be_in_rank_order_bit_for_bit(clusters, world_size, tmp_path):
    wrong = _module_from(tmp_path / "ring_order.py", RING_ORDER)
    said = exercises.check_sum_partials(clusters(world_size), wrong.ring_order_sum)
    assert said.startswith("not quite: every partial is in C once, but tile (") and "rank order" in said, said
    assert "(rank + step)" not in said
    # Issue 37: without the fp32 conversion the text asks for, fp16 partials round at every addition.
    said = exercises.check_sum_partials(clusters(world_size), wrong.sum_in_the_wire_dtype)
    assert said.startswith("not quite: with fp16 inputs (the partials travel in fp16) tile (") and \
        "add the partials in fp32" in said, said


PRECISION_AND_TYPE_MISTAKES = '''
import triton
import triton.language as tl
from gemmar.kernels import device


@triton.jit
def push_rounded_to_fp16(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank + step) % world_size
    device.atomic_add(C_tile, acc.to(tl.float16).to(tl.float32), rank, peer, heap_bases, mask=mask, sem="relaxed",
                      scope="sys")
    return peer


@triton.jit
def sum_rounded_to_fp16(total, received):
    return (total + received).to(tl.float16).to(tl.float32), received


@triton.jit
def payload_rounded_to_fp16(total, received):
    return total + received, received.to(tl.float16).to(tl.float32)


@triton.jit
def owners_sum_returned_in_fp16(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    total = tl.zeros(slot.shape, tl.float32)
    for source in range(world_size):
        total += tl.load(device.translate(slot, rank, source, heap_bases), cache_modifier=PEER_CACHE).to(tl.float32)
    return total.to(tl.float16)


@triton.jit
def float_column(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_row = (tile_id // tiles_per_group) * GROUP_SIZE_M
    rows = tl.minimum(num_pid_m - first_row, GROUP_SIZE_M)
    within = tile_id % tiles_per_group
    return first_row + within % rows, within / rows
'''


@pytest.mark.parametrize("world_size", [3])
@pytest.mark.parametrize("check_name,answer,verdict", [
    # Workshop dry run 4: the first three passed (whole-number inputs are exact in fp16); the fourth was told its
    # summation order was wrong; the fifth got Triton's type error from inside the kernel, with no line of its own.
    ("check_push_partial", "push_rounded_to_fp16",
     r"not quite: every partial is in C once, but your push_partial rounds each partial to fp16 before it is added: "
     r"C is off by \S+, where the package's own push_partial is off by \S+ on the same inputs .*"),
    ("check_reduce_step", "sum_rounded_to_fp16",
     r"not quite: every partial is in C once, but your reduce_step rounds the sum to fp16: every value in C is an "
     r"fp16 number\. .*"),
    ("check_reduce_step", "payload_rounded_to_fp16",
     r"not quite: every partial is in C once, but your reduce_step rounds a value to fp16 on its way into C .*about "
     r"what rounding to fp16 costs\. Keep partials and sums in fp32"),
    ("check_sum_partials", "owners_sum_returned_in_fp16",
     r"not quite: every partial is in C once, but your sum_partials' sum was rounded to fp16: every value in C is an "
     r"fp16 number .*Return the fp32 sum \(tl\.float32\).*"),
    ("check_tile_coords", "float_column",
     r"not yet: the pid_n your tile_coords returned at `return first_row \+ within % rows, within / rows` is not a "
     r"whole number \(a float\): the kernel needs integers \(int32\) for pid_m and pid_n.*// keeps whole numbers"),
])
def test_a_precision_or_type_mistake_is_named(clusters, world_size, check_name, answer, verdict, tmp_path):
    module = _module_from(tmp_path / f"mistake_{answer}.py", PRECISION_AND_TYPE_MISTAKES)
    said = getattr(exercises, check_name)(clusters(world_size), getattr(module, answer))
    assert re.fullmatch(verdict, said, re.DOTALL), said
    assert "order" not in said, said   # (the dtype is checked before the order of the sum)


UNCOMPILABLE = '''
import triton
from gemmar.kernels import device


@triton.jit
def push_by_table(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peers = {"next": (rank + step) % world_size}
    device.atomic_add(C_tile, acc, rank, peers["next"], heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peers["next"]
'''


@pytest.mark.parametrize("world_size", [2])
def test_a_part_right_under_the_interpreter_must_also_compile_for_a_gpu(clusters, world_size, tmp_path):
    # A dict is fine in Python, which the interpreter runs, and not in a compiled kernel.
    part = _module_from(tmp_path / "uncompilable.py", UNCOMPILABLE).push_by_table
    said = exercises.check_push_partial(clusters(world_size), part)
    assert said.startswith("not quite: right on the CPU ranks, but it would not compile for a GPU"), said
    assert said.endswith("in push_by_table, line 2 of the function: unsupported AST node type: Dict"), said
    assert said.result is not None and said.result.ok   # the run itself was right


PUZZLE_NOTEBOOKS = ("01_persistent_gemm", "02_atomic_accumulation", "03_ring_lock_handoff", "06_two_shot")
# An answer in words: what the ring's kernel, its docstring and the teaching mistake said of step 5 until dry run 4
# (issue 61), and what the package's own parts say of themselves.
ANSWERS_IN_WORDS = ("forward what we received", "what we received (not", "not our running sum", "not our sum",
                    "pass on what arrived", "not what was received", "instead of the tile just received",
                    "step s goes to rank", "the payload of step s is")


def _answer_lines():
    """The lines of code that are an answer: every line of the package's own parts and of the instructors'
    solutions that no puzzle's stub already holds (spaces and comments ignored)."""
    import ast

    root = os.path.join(os.path.dirname(__file__), "..")
    stubs = set()
    for notebook in PUZZLE_NOTEBOOKS:
        for cell in json.load(open(os.path.join(root, "notebooks", f"{notebook}.ipynb")))["cells"]:
            if "puzzle" in cell.get("metadata", {}).get("tags", ()):
                stubs |= {re.sub(r"\s", "", line.split("#")[0]) for line in "".join(cell["source"]).splitlines()}
    lines = set()
    for name in ("package_parts.py", "solutions.py"):
        text = open(os.path.join(root, "instructors", name)).read()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                for line in text.splitlines()[node.body[0].lineno - 1:node.end_lineno]:
                    code = re.sub(r"\s", "", line.split("#")[0])
                    if len(code) > 12 and code not in stubs and not code.startswith('"""'):
                        lines.add(code)
    return lines


def test_the_package_parts_are_encoded_from_the_instructors_text():
    """The kernels run the parts encoded in gemmar/kernels/puzzle_parts.dat; instructors/package_parts.py is their
    readable text, and the two agree (after an edit: python -m gemmar.analysis.source instructors/package_parts.py).
    show_source shows a part only with a right verdict, and then its text."""
    from gemmar.analysis.source import answer_source, encode, show_source
    from gemmar.kernels import atomics, gemm, puzzle_parts, ring, two_shot

    root = os.path.join(os.path.dirname(__file__), "..")
    readable = open(os.path.join(root, "instructors", "package_parts.py")).read()
    assert puzzle_parts.text() == readable and encode(readable) == open(puzzle_parts.DATA).read()
    for spec, name in ((atomics.SPEC, "tile_coords"), (atomics.SPEC, "push_partial"), (ring.SPEC, "reduce_step"),
                       (two_shot.SPEC, "sum_partials")):
        part = spec.parts[name].reference
        assert part is getattr(puzzle_parts, name)
        assert show_source(part).data.startswith(f"*The package's own `{name}` is the answer to a puzzle")
        assert show_source(part, once=exercises.Verdict("not quite: ...")).data == show_source(part).data
        assert show_source(part, once=exercises.Verdict("right! ...")).data == answer_source(name)
        assert answer_source(name).startswith(f"@triton.jit\ndef {name}(")
    assert gemm.tile_coords is puzzle_parts.tile_coords


@pytest.mark.parametrize("notebook", PUZZLE_NOTEBOOKS)
def test_no_answer_is_one_question_mark_away_before_the_check(notebook):
    """Workshop dry run 4 (issue 61): `gemmar.analysis.schedule.tile_coords??` printed puzzle 1's answer,
    inspect.getsource(tile_coords.fn) too, the kernel modules pointed to a file of answers, and notebook 3's ring
    kernel said step 5's answer in a comment. Every route from a puzzle notebook before its check (its cells; ??,
    ? and inspect on every object it imports or names; the source of the modules it imports or names and ?? on
    their attributes; what its show_source cells show), walked in a process of a notebook kernel's kind
    (tests/answer_routes.py), holds no line of an answer's code and none of the answers in words."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # (a Jupyter kernel's process)
    here = os.path.dirname(os.path.abspath(__file__))
    walked = subprocess.run([sys.executable, os.path.join(here, "answer_routes.py"), f"{notebook}.ipynb"],
                            cwd=os.path.join(here, "..", "notebooks"), env=env, capture_output=True, text=True,
                            timeout=300)
    assert walked.returncode == 0, walked.stderr[-2000:]
    routes = json.loads(walked.stdout)[f"{notebook}.ipynb"]
    walked_routes = {route for route, _ in routes}
    # The routes of the dry run are among those walked.
    expected = {"gemmar.exercises??", "inspect.getsource(gemmar.exercises)"}
    expected |= {"01_persistent_gemm": {"gemmar.analysis.schedule??", "gemmar.analysis.schedule.tile_coords?? (source)",
                                        "inspect.getsource(gemmar.analysis.schedule.tile_coords)",
                                        "gemmar.kernels.gemm??", "show_source(persistent_gemm)"},
                 "02_atomic_accumulation": {"gemmar.kernels.atomics??", "show_source(gemm_all_reduce_atomics)"},
                 "03_ring_lock_handoff": {"gemmar.kernels.ring??", "gemmar.kernels.mistakes??",
                                          "show_source(gemm_all_reduce_ring)"},
                 "06_two_shot": {"gemmar.kernels.two_shot??", "show_source(two_shot_reduce)"}}[notebook]
    expected = {route.replace("??", "?? (source)") if route.endswith("??") else route for route in expected}
    assert expected <= walked_routes, sorted(expected - walked_routes)
    answers = _answer_lines()
    assert {"returntotal+received,received", "peer=(rank+1+step)%world_size"} <= answers
    for route, text in routes:
        code = {re.sub(r"\s", "", line.split("#")[0]) for line in text.splitlines()}
        assert not code & answers, (route, sorted(code & answers))
        said = " ".join(text.lower().split())
        assert not [words for words in ANSWERS_IN_WORDS if words in said], (route, text[:300])
