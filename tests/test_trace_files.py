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
