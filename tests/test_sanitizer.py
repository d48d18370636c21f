"""The race and bounds sanitizer (gemmar/sanitizer): clean runs report nothing, every mistake reports its race
or its bounds error on the first run, with no straggler, and a race that gave the right values is still found.
"""

import io
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch
import pytest
import triton
import triton.language as tl

import gemmar
import one_shot_push
from gemmar.errors import UsageError
from gemmar.kernels import device
from gemmar.sanitizer import analyse
from inputs import random_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANDOFF = os.path.join(ROOT, "tests", "iris_programs", "flag_handoff.py")
HOST_ZERO = os.path.join(ROOT, "tests", "iris_programs", "host_zero.py")


# -- happens-before on hand-made records (no engines) ------------------------------------------------------
def access(seq, call, kind, key, sem=None, atomic=None, line=1, name="flag"):
    atomic = kind == "rmw" if atomic is None else atomic
    return ("access", seq, call, 0, kind, atomic, sem, "sys", None, np.array([key], np.int64), 4,
            ("k.py", line, "k"), (name, (64,), "int32", key), 0, seq * 1000, (0, 1) if kind == "rmw" else None)


def records(rank0, rank1):
    """Two ranks, one kernel call each (one program), with the given accesses in between."""
    return [dict(rank=r, world_size=2, events=[("start", 1 + r, 1, f"kernel{r}", "main")] + list(events) +
                 [("end", 1000 + r, 1)]) for r, events in enumerate((rank0, rank1))]


def test_a_release_and_the_acquire_that_reads_it_order_the_data():
    data, flag = 0, 64
    ordered = records([access(10, 1, "write", data, name="data"), access(11, 1, "rmw", flag, "release")],
                      [access(12, 1, "rmw", flag, "acquire"), access(13, 1, "read", data, name="data")])
    assert analyse(ordered).ok
    # The same, with the acquire before the release in the memory's order: it read an older value.
    early = records([access(10, 1, "write", data, name="data"), access(12, 1, "rmw", flag, "release")],
                    [access(11, 1, "rmw", flag, "acquire"), access(13, 1, "read", data, name="data")])
    report = analyse(early)
    assert [r.element for r in report.races] == ["data[0]"], report
    assert "acquires flag[0] (rank 0's) at k.py:1 first, but not the value" in report.races[0].text


def test_a_relaxed_read_modify_write_continues_a_release_sequence_and_a_plain_store_ends_it():
    data, flag = 0, 64
    rank1_reads = [access(13, 1, "rmw", flag, "acquire"), access(14, 1, "read", data, name="data")]
    # rank 0 releases; then a relaxed add (of rank 0's second program, say) before rank 1's acquire.
    continued = records([access(10, 1, "write", data, name="data"), access(11, 1, "rmw", flag, "release"),
                         access(12, 1, "rmw", flag, "relaxed")], rank1_reads)
    assert analyse(continued).ok
    ended = records([access(10, 1, "write", data, name="data"), access(11, 1, "rmw", flag, "release"),
                     access(12, 1, "write", flag)], rank1_reads)
    report = analyse(ended)
    assert {r.element for r in report.races} == {"data[0]", "flag[0]"}, report
    plain = next(r for r in report.races if r.element == "flag[0]")
    assert "writes this flag with a plain store" in plain.text


def test_polls_race_with_plain_writes_only_and_atomics_never_race_with_each_other():
    flag = 64
    assert analyse(records([access(10, 1, "rmw", flag, "relaxed")],
                           [access(11, 1, "read", flag, atomic=True), access(12, 1, "rmw", flag, "relaxed")])).ok
    report = analyse(records([access(10, 1, "write", flag)], [access(11, 1, "read", flag, atomic=True)]))
    assert len(report.races) == 1 and "polls it" in report.races[0].text


def host_write(seq, lo, hi, stream="main"):
    return ("host write", seq, "zero_", np.array([lo], np.int64), np.array([hi], np.int64), ("p.py", 7, "main"),
            ("heap tensor at byte 0", (64,), "int32", 0), 0, stream, seq * 1000)


def test_a_host_write_races_with_a_peers_kernel_unless_a_meeting_orders_them():
    """Rank 1's host zero-fills [0, 256) of rank 0's heap; rank 0's kernel writes element 2, before or after."""
    for kernel_seq in (5, 15):   # the kernel's write before the host's (checked at once), or after (from the map)
        report = analyse([dict(rank=0, world_size=2, events=[("start", kernel_seq - 1, 1, "k0", "main"),
                                                             access(kernel_seq, 1, "write", 8, name="data"),
                                                             ("end", kernel_seq + 1, 1)]),
                          dict(rank=1, world_size=2, events=[host_write(10, 0, 256)])])
        assert len(report.races) == 1, report
        assert report.races[0].element == "data[0]"   # (named as the kernel names the buffer)
        assert "rank 1 host (zero_) writes it at p.py:7" in report.races[0].text
        assert "rank 0 program 0 (k0) writes it at k.py:1" in report.races[0].text
        assert "a barrier of both ranks between rank 1's host write and" in report.races[0].text
    meeting = dict(meeting=(None, 1))
    ordered = [dict(rank=0, world_size=2, events=[("host", 12, "arrive", meeting), ("host", 14, "leave", meeting),
                                                  ("start", 15, 1, "k0", "main"), access(16, 1, "write", 8),
                                                  ("end", 17, 1)]),
               dict(rank=1, world_size=2, events=[host_write(10, 0, 256), ("host", 11, "arrive", meeting),
                                                  ("host", 13, "leave", meeting)])]
    assert analyse(ordered).ok


def test_a_host_write_follows_its_own_streams_kernels_and_precedes_its_later_launches():
    flag = 8
    same_stream = [dict(rank=0, world_size=1, events=[("start", 1, 1, "k", "main"), access(2, 1, "rmw", flag, "relaxed"),
                                                      ("end", 3, 1), host_write(4, 0, 64),
                                                      ("start", 5, 2, "k", "main"), access(6, 2, "write", flag),
                                                      ("end", 7, 2)])]
    assert analyse(same_stream).ok
    other_stream = [dict(rank=0, world_size=1, events=[("start", 1, 1, "k", "side"), access(2, 1, "write", flag),
                                                       ("end", 3, 1), host_write(4, 0, 64)])]
    report = analyse(other_stream)
    assert len(report.races) == 1 and "a synchronize (or a wait_stream)" in report.races[0].text, report


def test_a_large_host_fill_is_one_record_of_byte_ranges(tmp_path):
    """64 MB zero-filled, a strided view, a row slice: a handful of records, each a few ranges, in well under a
    second; and the dispatch mode that saw them is gone after the run."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from gemmar import sanitizer
    from gemmar.sanitizer.record import MAX_RANGES

    arena = torch.empty(64 << 20, dtype=torch.uint8)
    heap = type("Heap", (), dict(backend="cpu", rank=0, world_size=1, size=arena.numel(), folder=str(tmp_path),
                                 heap_bases=torch.tensor([arena.data_ptr()], dtype=torch.int64),
                                 allocation_table=lambda self: (np.array([0]), np.array([arena.numel()]),
                                                                [("big", (16 << 20,), "float32")])))()
    big = arena.view(torch.float32)
    outside = torch.zeros(1000)
    with sanitizer.recording(heap) as records:
        outside.fill_(2)                        # not on the heap: not recorded (torch's first dispatch: imports)
        started = time.monotonic()
        big.zero_()
        big.view(4096, -1)[:, :16].fill_(1)     # 4096 rows of 16 elements: a range each
        big[::2].zero_()                        # 8M runs of one element: its span
        took = time.monotonic() - started
    assert took < 1, took
    assert not _get_current_dispatch_mode_stack()
    writes = [e for e in records[0]["events"] if e[0] == "host write"]
    assert [(e[2], e[3].size) for e in writes] == [("zero_", 1), ("fill_", MAX_RANGES), ("zero_", 1)], writes
    assert (writes[0][3][0], writes[0][4][0]) == (0, 64 << 20)
    assert (writes[1][3][1], writes[1][4][1]) == (4096 * 4, 4096 * 4 + 64)
    assert writes[0][5][0] == __file__ and writes[0][6][0] == "big"
    # A kernel's write later in the same rank's program: after them all, and the analysis stays small.
    events = records[0]["events"] + [("start", 10 ** 6, 1, "k", "main"), access(10 ** 6 + 1, 1, "write", 8),
                                     ("end", 10 ** 6 + 2, 1)]
    assert analyse([dict(rank=0, world_size=1, events=events)]).ok


def test_bad_sanitize_values_are_refused():
    with pytest.raises(UsageError, match=r"sanitize='yes' is not allowed: use True or False"):
        gemmar.RunConfig(sanitize="yes").validate()


# -- gemmar's own kernels -----------------------------------------------------------------------------------
CLEAN = [("two_shot", dict(m=72, n=40, k=48, comm_sms=1)), ("two_shot", dict(m=40, n=72, k=40, comm_sms=3)),
         ("ring", dict(m=72, n=40, k=48)), ("atomics", dict(m=40, n=72, k=40))]


@pytest.mark.parametrize("world_size", [2, 4])   # (3 ranks: the all-reduce, a user's algorithm, Iris's programs)
@pytest.mark.parametrize("algorithm,shape", CLEAN)
def test_the_builtin_algorithms_have_no_race_and_stay_in_bounds(clusters, world_size, algorithm, shape):
    """Edge tiles (72 and 40 are not multiples of 32), back-to-back launches: no race, no bounds error."""
    result = clusters(world_size).bench(algorithm=algorithm, BLK_M=32, BLK_N=32, BLK_K=16, num_sms=2,
                                        iterations=3, sanitize=True, **shape)
    assert result.ok, result.max_abs_diff
    report = result.sanitizer
    assert report.ok and report.accesses > 20 * world_size, str(report)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_standalone_all_reduce_one_shot_and_a_users_algorithm_have_no_race(clusters, world_size):
    cluster = clusters(world_size)
    for scheme in ("two_shot", "one_shot"):
        figures = cluster.all_reduce(5000, datatype="fp32", iterations=3, scheme=scheme, sanitize=True)
        assert figures["ok"] and figures["sanitizer"].ok, (scheme, str(figures["sanitizer"]))
    A, B = random_inputs(40, 56, 36, torch.float16, seed=3)
    for algorithm in (one_shot_push.SPEC, "one_shot"):
        result = cluster.gemm_all_reduce(A, B, algorithm=algorithm, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3,
                                         iterations=2, sanitize=True)
        assert result.ok and result.sanitizer.ok, (algorithm, str(result.sanitizer))


@pytest.mark.parametrize("world_size", [2])
def test_two_shots_skipped_partial_wait_is_a_race_on_the_first_run(clusters, world_size):
    result = clusters(world_size).bench(algorithm="two_shot", m=64, n=64, k=64, BLK_M=32, BLK_N=32, BLK_K=32,
                                        num_sms=2, iterations=1, sanitize=True, mistake="skip_partial_wait")
    races = result.sanitizer.races
    assert races and all(r.first.buffer[0] == "partials" for r in races), str(result.sanitizer)
    text = races[0].text
    assert "(two_shot_gemm) writes it at two_shot.py:" in text and "(two_shot_reduce) reads it at owner_reduce.py:" in text
    assert "releases partial_ready[" in text and "never acquires it" in text


@pytest.mark.parametrize("world_size", [2])
def test_a_race_is_drawn_on_the_gantt_chart_and_flows_in_perfetto(clusters, world_size, tmp_path):
    result = clusters(world_size).bench(algorithm="two_shot", m=64, n=64, k=64, BLK_M=32, BLK_N=32, BLK_K=32,
                                        num_sms=2, iterations=2, trace=True, sanitize=True, mistake="skip_partial_wait")
    races = result.sanitizer.races
    trace = result.trace
    assert [r["text"] for r in trace.meta["races"]] == [r.text for r in races]
    fig = trace.gantt(iteration=0)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("race: two accesses nothing orders") for t in legend), legend
    crosses = [c for c in fig.axes[0].collections if c.get_offsets().shape[0] == 2]
    assert crosses, "no race drawn"
    doc = trace.to_perfetto(tmp_path / "run.perfetto.json")
    flows = [e for e in doc["traceEvents"] if e.get("cat") == "race" and e["ph"] in "sf"]
    assert flows and {e["ph"] for e in flows} == {"s", "f"}
    marked = [text for state in trace.replay_states(0) for text in state["races"]]   # the replay says when
    assert any(re.fullmatch(r"race 1: rank \d writes partials\[\d+, 0\] at two_shot\.py:\d+", t) for t in marked), marked
    trace.save(tmp_path / "run.trace.json.gz")   # the races travel with a saved trace
    assert gemmar.Trace.load(tmp_path / "run.trace.json.gz").meta["races"] == trace.meta["races"]


@pytest.mark.parametrize("world_size", [2])
def test_the_rings_skipped_slot_free_wait_is_a_race_when_nothing_else_orders_the_slot(clusters, world_size):
    """One tile per program: the next launch's store into the peer's slot is ordered after the peer's read by
    nothing but the skipped wait. (With two tiles per program at two ranks the later tile's messages order
    it: no run could go wrong there, and the sanitizer says so.)"""
    cluster = clusters(world_size)
    settings = dict(algorithm="ring", n=32, k=64, BLK_M=32, BLK_N=32, BLK_K=32, iterations=2, sanitize=True,
                    mistake="skip_slot_free_wait")
    result = cluster.bench(m=32, num_sms=1, **settings)
    races = result.sanitizer.races
    assert result.ok and len(races) == 1, str(result.sanitizer)
    assert races[0].first.buffer[0] == "ring_buffer" and {races[0].first.kind, races[0].second.kind} == {"read", "write"}
    assert "releases slot_free[0]" in races[0].text and "never acquires it" in races[0].text
    assert cluster.bench(m=64, num_sms=1, **settings).sanitizer.ok
    assert cluster.bench(m=32, num_sms=1, **{**settings, "mistake": "none"}).sanitizer.ok


@triton.jit
def push_without_mask(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank + 1 + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, sem="relaxed", scope="sys")
    return peer


@pytest.mark.parametrize("world_size", [2])
def test_a_push_without_mask_on_an_edge_tile_is_named_before_it_writes(clusters, world_size):
    """C is one plane of a [2, M, N] buffer: launch 1's stray rows land in launch 2's plane (a race with its
    zeroing), launch 2's past the buffer's end, which stops the run."""
    with pytest.raises(UsageError, match=r"your push_partial failed: HeapBoundsError: "
                                         r"rank \d, program \d: an atomic at `device.atomic_add\(.*\)` \(push_without_mask\) reaches "
                                         r"element \d+ of C_pair \(float32\[2, 40, 40\], 3200 elements\) on rank \d's "
                                         r"heap, past its end"):
        clusters(world_size).bench(algorithm="atomics", m=40, n=40, k=32, BLK_M=32, BLK_N=32, BLK_K=32,
                                   num_sms=2, iterations=2, sanitize=True, parts={"push_partial": push_without_mask})


@triton.jit
def push_without_modulo(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = rank + 1 + step
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer


@pytest.mark.parametrize("world_size", [3])
def test_a_puzzle_answer_that_forgets_the_modulo_is_told_the_rank_it_asked_for(clusters, world_size, capsys):
    """Issue 37's crash "explained" as swapped ranks: the sanitizer (on in the puzzle checks) names the rank."""
    from gemmar import exercises

    cluster = clusters(world_size)
    said = exercises.check_push_partial(cluster, push_without_modulo)
    assert re.fullmatch(r"not yet: your push_partial failed: HeapBoundsError: rank \d, "
                        r"program \d asked for rank [3-5] at `device\.atomic_add\(.*\)` \(push_without_modulo\): ranks are 0 to 2 "
                        r"\(world_size=3\)", said), said
    assert exercises.check_push_partial(cluster, push_with_modulo).startswith("right!")   # fresh ranks, by itself
    assert "(the last check's ranks were stopped at an access outside its buffer: starting 3 rank(s) again)" in \
        capsys.readouterr().out


@triton.jit
def sum_with_translate_swapped(slot, rank, world_size, heap_bases, PEER_CACHE: tl.constexpr):
    total = tl.zeros(slot.shape, tl.float32)
    for source in range(world_size):
        total += tl.load(device.translate(slot, source, rank, heap_bases), cache_modifier=PEER_CACHE).to(tl.float32)
    return total


@pytest.mark.parametrize("world_size", [2])
def test_a_puzzle_answer_with_translates_ranks_swapped_is_told_which_rank_from_rank_must_be(clusters, world_size):
    from gemmar import exercises

    said = exercises.check_sum_partials(clusters(world_size), sum_with_translate_swapped)
    # (whichever rank gets there first: rank r reads with from_rank = the other one)
    assert re.search(r"HeapBoundsError: rank (\d), program \d: a read at `total \+= tl\.load\(.*\)` \(sum_with_translate_swapped\) translates a "
                     r"pointer from rank (\d) to rank \1, but the pointer is in rank \1's heap, not rank \2's, so the "
                     r"address lands on no heap: the caller is rank \1, so from_rank must be \1", said), said


@triton.jit
def push_with_modulo(C_tile, acc, mask, step, rank, world_size, heap_bases):
    peer = (rank + 1 + step) % world_size
    device.atomic_add(C_tile, acc, rank, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
    return peer


# -- Iris programs, unchanged ----------------------------------------------------------------------------
def run_handoff(cluster, mistake):
    out, err = io.StringIO(), io.StringIO()
    result = cluster.run_script(HANDOFF, "--mistake", mistake, timeout=120, out=out, err=err, sanitize=True)
    return result, out.getvalue()


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_iris_programs_plain_store_flag_is_a_race_even_when_every_value_arrived(clusters, world_size):
    cluster = clusters(world_size)
    result, out = run_handoff(cluster, "none")
    assert result.ok and result.sanitizer.ok, out
    result, out = run_handoff(cluster, "plain_flag")
    assert result.ok and out.count("100 of 100 values arrived intact") == world_size, out   # right, by luck
    texts = [r.text for r in result.sanitizer.races]
    assert any(t.startswith("race on flags[0]") and "writes this flag with a plain store" in t for t in texts), texts
    assert any(t.startswith("race on target[0]") and "releases nothing after writing it: make this write a release" in t
               for t in texts), texts
    assert "[gemmar] sanitizer: " in out and "race(s)" in out
    result, out = run_handoff(cluster, "no_wait")
    races = result.sanitizer.races
    assert len(races) == 1 and "reads it before its acquire of flags[0]" in races[0].text, out


@pytest.mark.parametrize("world_size", [3])
def test_todays_iris_programs_ccl_and_ops_have_no_race(clusters, world_size):
    """Iris's ccl.all_reduce and ops.matmul_all_reduce as today's programs call them (gemmar's kernels behind)."""
    cluster = clusters(world_size)
    for program, args in (("torchrun_ccl.py", ["-m", "40", "-n", "72", "--iterations", "2"]),
                          ("ops_matmul_all_reduce.py", ["-m", "50", "-n", "70", "-k", "90", "--iterations", "2"])):
        result = cluster.run_script(os.path.join(ROOT, "examples", "iris_today", program), *args, timeout=120,
                                    echo=False, sanitize=True)
        assert result.ok and result.sanitizer.ok and result.sanitizer.accesses > 100, (program, str(result.sanitizer))


@pytest.mark.parametrize("world_size", [2])
def test_an_iris_programs_stray_store_and_missing_rank_are_named(clusters, world_size):
    cluster = clusters(world_size)
    result, _ = run_handoff(cluster, "no_mask")
    assert result.exit_codes == [1, 1]
    assert result.failure_lines()[0] == (
        "rank 0: HeapBoundsError: rank 0, program 1: a write at flag_handoff.py:28 reaches element 100 of target "
        "(float32[100], 100 elements) on rank 1's heap, past its end: byte %s is in no buffer"
        % result.failure_lines()[0].rsplit("byte ", 1)[1].split(" ")[0])
    result, _ = run_handoff(cluster, "bad_rank")
    assert result.failure_lines()[1] == ("rank 1: HeapBoundsError: rank 1, program 0 asked for rank 2 at "
                                         "flag_handoff.py:30: ranks are 0 to 1 (world_size=2)")
    assert cluster.run_script(HANDOFF, timeout=60, echo=False).ok   # the ranks still work


def line_of(path, text):
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


@pytest.mark.parametrize("world_size", [2])
def test_a_host_zero_fill_a_peers_kernel_writes_is_a_race_unless_a_barrier_is_between(clusters, world_size):
    cluster = clusters(world_size)
    result = cluster.run_script(HOST_ZERO, timeout=120, echo=False, sanitize=True)
    assert result.ok, result.failure_lines()
    texts = {r.element: r.text for r in result.sanitizer.races}
    assert set(texts) == {"target[0]", "flags[0]"}, str(result.sanitizer)
    assert (f"rank 1 host (zero_) writes it at host_zero.py:{line_of(HOST_ZERO, 'target.zero_()')}" in texts["target[0]"]
            and f"(send_kernel) writes it at host_zero.py:{line_of(HOST_ZERO, 'iris.store(')}" in texts["target[0]"])
    assert f"rank 1 host (zero_) writes it at host_zero.py:{line_of(HOST_ZERO, 'flags = shmem.zeros(')}" in texts["flags[0]"]
    assert "and 63 more locations of target" in texts["target[0]"]
    ordered = cluster.run_script(HOST_ZERO, "--barrier", timeout=120, echo=False, sanitize=True)
    assert ordered.ok and ordered.sanitizer.ok, str(ordered.sanitizer)


def test_gemmar_run_sanitize_exits_1_on_a_race(tmp_path):
    env = {**os.environ, "CI": "true"}
    run = subprocess.run([sys.executable, "-m", "gemmar", "run", "-r", "2", "--backend", "cpu", "--sanitize", HANDOFF,
                          "--mistake", "no_wait"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert "gemmar run: the sanitizer found 1 race(s), above" in run.stderr
    assert re.search(r"^- race on target\[0\] in rank \d's heap", run.stdout, re.M), run.stdout
