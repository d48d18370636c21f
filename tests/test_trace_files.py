"""Trace files that must not hang, exhaust or crash the tools: each is one line (UsageError / exit 2)."""

import gzip
import json
import os
import threading

import numpy as np
import pytest

from gemmar import UsageError, cli
from gemmar.analysis.trace import RAW_COLUMNS, Trace

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
RING = os.path.join(DATA, "cpu-ring-4ranks-48x40x40.trace.json.gz")


def doc_of(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def written(tmp_path, doc, name="t.trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_fifo_and_a_device_are_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.trace.json"
    os.mkfifo(fifo)
    said = {}

    def load(path, key):
        try:
            Trace.load(path)
        except UsageError as e:
            said[key] = str(e)

    for path, key in ((str(fifo), "fifo"), ("/dev/zero", "zero")):
        t = threading.Thread(target=load, args=(path, key), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"Trace.load({path}) still reading after 10 s"
        assert said[key].endswith("is not a regular file"), said


def test_deep_nesting_and_oversized_files_are_one_line(tmp_path, monkeypatch):
    deep = tmp_path / "deep.trace.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(UsageError, match="nested too deep"):
        Trace.load(str(deep))
    import gemmar.analysis.trace as trace_module

    monkeypatch.setattr(trace_module, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(UsageError, match="holds more than"):
        Trace.load(RING)   # 1000 bytes unpacked is far less than this file


@pytest.mark.parametrize("column,value,message", [
    ("pid_m", 1000, "tile coordinates outside the grid"),
    ("pid_n", -3, "tile coordinates outside the grid"),
    ("tile", 9, "a tile outside the grid"),          # 3 x 3 tiles: 0..8
    ("kind_id", 9, "an event kind that ring does not record"),   # two_shot's publish in a ring trace
])
def test_events_outside_what_the_run_had_are_refused(tmp_path, column, value, message):
    doc = doc_of(RING)
    doc["events"][5][RAW_COLUMNS.index(column)] = value
    with pytest.raises(UsageError, match=message):
        Trace.load(written(tmp_path, doc))


def test_a_huge_grid_is_refused_before_any_array_is_made(tmp_path):
    doc = doc_of(RING)
    doc["meta"].update(m=1 << 20, n=1 << 20)
    trace = Trace.load(written(tmp_path, doc))
    with pytest.raises(UsageError, match="too many to draw"):
        trace.tile_grid()


def test_gantt_cli_write_targets_are_refused_in_one_line(capsys, tmp_path):
    fifo = tmp_path / "out.png"
    os.mkfifo(fifo)
    for argv in (["gantt", RING, "-o", str(fifo)], ["gantt", RING, "--perfetto", "/dev/full"],
                 ["gantt", RING, "--tile_grid", "/proc/gemmar-grid.png"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("gemmar: error: "), err


def test_two_shot_traces_still_load_with_their_owner_waits():
    trace = Trace.load(os.path.join(DATA, "h200x1-two_shot-4ranks-8192x8192x16384.trace.json.gz"))
    waits = trace.events[trace.events["kind"] == "result_wait"]
    assert len(waits) and (waits["tile"] == -1).all() and set(waits["peer"]) == {0, 1, 2, 3}
    assert np.isfinite(trace.summary()["span_us"]).all()


def test_launch_figures_of_a_saved_two_shot_trace():
    """Trace.launches and Trace.event_medians give the figures BENCHMARKS.md reports for this trace (4 ranks
    sharing one H200, launched kernel by kernel, 2026-12-03)."""
    trace = Trace.load(os.path.join(DATA, "h200x1-two_shot-4ranks-8192x8192x16384-2026-12-03.trace.json.gz"))
    launches = trace.launches()
    assert list(launches.index) == [0, 1, 2, 3]
    assert all(len(gaps) == 3 for gaps in launches["start_gaps_us"])
    assert max(max(gaps) for gaps in launches["start_gaps_us"][1:]) < 40     # 16-37 us
    assert launches["tail_us"].between(10, 25).all() and (launches["tail_share"] < 0.015).all()
    assert launches["span_us"].between(3300, 3600).all()
    medians = trace.event_medians()
    assert 3.5 < medians["broadcast"] < 5 and 40 < medians["gemm"] < 44
    # A trace of one iteration (the first) keeps it for the medians.
    first = Trace(trace.raw[trace.raw[:, RAW_COLUMNS.index("iteration")] == 0], trace.meta)
    assert first.event_medians()["gemm"] > 40 and list(first.launches().index) == [0]


# -- An attacker's third round (issue 51, attack 5): a file's text is data, never code or a format --------------

def iris_doc(events=None, **metadata):
    """A small well-formed Iris device trace (as shmem.tracing.export() writes it): 2 ranks, 2 x 2 tiles."""
    events = events or [dict(name=name, cat="iris", ph="X", ts=float(10 * i), dur=5.0, pid=rank, tid=0,
                             args=dict(program_id=0, pid_m=i // 2, pid_n=i % 2, target_rank=1 - rank, op_index=i))
                        for rank in range(2) for i, name in enumerate(["load", "compute", "put", "wait"])]
    return dict(traceEvents=events, metadata=dict(time_unit="us", **metadata))


def test_a_wait_text_is_filled_with_bare_names_only(tmp_path):
    """A waits_for text of {tile:>900000000} (900 MB of spaces through str.format) or {rank.__class__} (an
    attribute look-up) is shown as written, at once; a bare {tile} is still filled in."""
    import time

    from gemmar.algorithms import get
    from gemmar.analysis.replay import build_states

    doc = doc_of(RING)
    proto = get("ring").describe()
    hostile = "tile {tile}: {tile:>900000000} {rank.__class__} {0} {world_size}"
    for phase in proto["phases"]:
        if phase.get("waits_for"):
            phase["waits_for"] = hostile
    doc["meta"]["protocol"] = proto
    started = time.monotonic()
    states = build_states(Trace.load(written(tmp_path, doc)))
    waiting = [line for state in states for line in state["waiting"]]
    assert time.monotonic() - started < 20
    assert waiting and all("{tile:>900000000} {rank.__class__} {0} 4" in line for line in waiting), waiting[:3]
    assert all(": tile " in line and "{tile}" not in line for line in waiting), waiting[:3]


def test_formula_marks_in_names_are_drawn_as_written(tmp_path):
    """An algorithm name and legend labels with $ (matplotlib's formula marks, a bad formula raised)."""
    doc = doc_of(RING)
    doc["meta"]["algorithm"] = r"ring $\frac{"
    from gemmar.algorithms import get

    proto = get("ring").describe()
    proto["labels"] = {key: value + r" $^{" for key, value in proto["labels"].items()}
    doc["meta"]["protocol"] = proto
    trace = Trace.load(written(tmp_path, doc))
    trace.gantt(path=str(tmp_path / "g.png"))
    trace.tile_grid(path=str(tmp_path / "t.png"))
    assert (tmp_path / "g.png").stat().st_size > 1000 and (tmp_path / "t.png").stat().st_size > 1000


@pytest.mark.parametrize("done, message", [
    ({"kind": "final_store", "where": "somewhere"}, "its where one of rank, every_rank, peer"),
    ({"kind": "no_such_phase", "where": "rank"}, "its kind must be a phase"),
    ("everything", "done rule everything: its kind must be a phase"),
])
def test_a_protocol_done_rule_is_checked_on_load(tmp_path, done, message):
    from gemmar.algorithms import get

    doc = doc_of(RING)
    doc["meta"]["protocol"] = dict(get("ring").describe(), done=done)
    with pytest.raises(UsageError, match=message) as refused:
        Trace.load(written(tmp_path, doc))
    assert "\n" not in str(refused.value)


def test_an_iris_trace_draws_its_tile_grid_and_replays(tmp_path, capsys):
    """A well-formed Iris trace has no done rule: --tile_grid drew nothing but a TypeError before."""
    from gemmar.analysis.replay import build_states

    path = written(tmp_path, iris_doc())
    assert cli.main(["gantt", path, "-o", str(tmp_path / "g.png"), "--tile_grid", str(tmp_path / "t.png")]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert build_states(Trace.load(path))


@pytest.mark.parametrize("change, message", [
    (lambda d: d["traceEvents"][0].update(ts=1e300), "ts"),
    (lambda d: d["traceEvents"][0].update(ts=float("inf")), "OverflowError|ts"),
    (lambda d: d["metadata"].update(world_size="lots"), "world_size is 'lots'"),
    (lambda d: d["metadata"].update(world_size=1), "world_size is 1"),
    (lambda d: d["traceEvents"][0].update(pid=2 ** 40), "rank 1099511627776 is not from 0 to 63"),
    (lambda d: d["traceEvents"][0].update(pid=-7), "rank -7 is not from 0 to 63"),
    (lambda d: d["traceEvents"][3].update(dur=-5.0), "dur .* is negative"),
    (lambda d: d["traceEvents"][0]["args"].update(pid_m=2 ** 40), "pid_m 1099511627776"),
])
def test_an_iris_trace_out_of_range_is_one_line(tmp_path, change, message):
    doc = iris_doc()
    change(doc)
    with pytest.raises(UsageError, match=message) as refused:
        Trace.load(written(tmp_path, doc))
    assert "\n" not in str(refused.value)


def test_a_replay_of_a_huge_grid_is_refused_as_drawing_is(tmp_path):
    """65536 x 65536 tiles: the replay's arrays (ranks x tiles) would need 100+ GiB."""
    from gemmar.analysis.replay import build_states

    doc = iris_doc()
    doc["traceEvents"][0]["args"].update(pid_m=65535, pid_n=65535)
    trace = Trace.load(written(tmp_path, doc))
    with pytest.raises(UsageError, match="65536 x 65536 tiles, too many to draw or replay"):
        build_states(trace)


def test_a_traces_repr_says_k_global_and_per_rank():
    """Workshop dry run 3: notebook 5's keys (files named by K per rank) and the traces (K global) disagreed."""
    trace = Trace.load(os.path.join(DATA, "h200-atomics-8192x8192x8192.trace.json.gz"))
    assert "8192x8192x16384 (K 8192 per rank)" in repr(trace)


def _iris_trace(path, ranks, program=0, pid_m=0, pid_n=0):
    """An Iris device trace of ``ranks`` ranks, an event per rank; rank 0's names ``program``, ``pid_m``, ``pid_n``."""
    events = [dict(name="compute", cat="iris", ph="X", ts=float(r), dur=1.0, pid=r, tid=0,
                   args=dict(program_id=program if r == 0 else 0, pid_m=pid_m if r == 0 else 0,
                             pid_n=pid_n if r == 0 else r % 4, target_rank=-1, op_index=r)) for r in range(ranks)]
    path.write_text(json.dumps(dict(traceEvents=events, metadata=dict(time_unit="us"))))
    return str(path)


def test_a_trace_naming_program_2_to_the_20_draws_its_tile_grid(tmp_path, capsys):
    """A trace of 9 ranks whose one event names program 2**20 - 1: a colour per program (3.2 GiB, then an
    OverflowError in matplotlib) before; now a ramp of colours, ranks in rows of 8. A grid too large to draw is
    refused in one line before anything is allocated."""
    trace = _iris_trace(tmp_path / "wide.trace.json", 9, program=(1 << 20) - 1)
    assert cli.main(["gantt", trace, "-o", str(tmp_path / "g.png"), "--tile_grid", str(tmp_path / "t.png")]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "t.png").stat().st_size > 1000 and (tmp_path / "g.png").stat().st_size > 1000
    huge = _iris_trace(tmp_path / "huge.trace.json", 8, pid_m=1023, pid_n=1023)
    assert cli.main(["gantt", huge, "-o", str(tmp_path / "g2.png"), "--tile_grid", str(tmp_path / "t2.png")]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert "tile grid of 8 ranks x 1024 x 1024 tiles is too large to draw" in line, line
    assert not (tmp_path / "t2.png").exists()
