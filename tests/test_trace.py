"""Traces. What the kernels record is checked on a live 4-rank run (every event of every tile on every rank,
causal order across ranks); the analysis (save/load, Perfetto, figures, replay, schedule, CLI) runs on
traces saved from such runs in data/, with no cluster."""

import gzip
import json
import re
import os
import subprocess
import sys

import matplotlib
import numpy as np
import pytest

import gemmar
from gemmar.analysis.trace import Trace

matplotlib.use("Agg")

# The shape of the live runs here and of the saved traces in data/ (recorded the same way).
SHAPE = dict(m=48, n=40, k=40, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3, gsize_m=2, iterations=2, trace=True)
TILES = 3 * 3
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


@pytest.fixture(scope="module")
def live(clusters):
    cluster = clusters(4)
    return {alg: cluster.bench(gemmar.RunConfig(algorithm=alg, comm_sms=2, **SHAPE)).trace
            for alg in ("ring", "atomics", "two_shot")}


@pytest.fixture(scope="module")
def traces():
    """Saved 4-rank CPU traces of SHAPE: analysis tests need no cluster."""
    return {alg: Trace.load(os.path.join(DATA, f"cpu-{alg}-4ranks-48x40x40.trace.json.gz"))
            for alg in ("ring", "atomics")}


def test_saved_traces_are_of_the_shape_the_tests_expect(traces):
    for alg, t in traces.items():
        assert t.meta["algorithm"] == alg and t.meta["world_size"] == 4
        assert {k: t.meta[k] for k in ("m", "n", "k", "BLK_M", "BLK_N", "num_sms", "gsize_m", "iterations")} == \
            {k: SHAPE[k] for k in ("m", "n", "k", "BLK_M", "BLK_N", "num_sms", "gsize_m", "iterations")}
        assert len(t.events) == 2 * t.expected_event_count()


def test_ring_trace_has_every_event_of_every_tile_on_every_rank(live):
    t = live["ring"]
    ev = t.events
    assert t.meta["dropped_events"] == [0, 0, 0, 0]
    for (rank, it), d in ev.groupby(["rank", "iteration"]):
        counts = d["kind"].value_counts().to_dict()
        assert counts == {"gemm": TILES, "store": TILES, "slot_wait": 3 * TILES, "send": 3 * TILES,
                          "signal": 3 * TILES, "recv_wait": 3 * TILES, "reduce": 3 * TILES}
        assert sorted(d.loc[d["kind"] == "gemm", "tile"]) == list(range(TILES))
        # Program p did exactly the tiles p, p + 3, ...
        for e in d[d["kind"] == "gemm"].itertuples():
            assert e.tile % 3 == e.program
    assert len(ev) == 2 * t.expected_event_count()


def test_ring_events_are_causal_across_ranks(live):
    ev = live["ring"].events
    W = 4
    key = ["iteration", "tile", "step"]
    signal = ev[ev["kind"] == "signal"].set_index(["rank"] + key)
    recv = ev[ev["kind"] == "recv_wait"].set_index(["rank"] + key)
    reduce = ev[ev["kind"] == "reduce"].set_index(["rank"] + key)
    gemm = ev[ev["kind"] == "gemm"].set_index(["rank", "iteration", "tile"])
    checked = 0
    for (rank, it, tile, step), r in recv.iterrows():
        sender = (rank - 1) % W
        sent = signal.loc[(sender, it, tile, step)]
        # The receive ends only after the sender has started signalling that very message ...
        assert r["t_end_ns"] >= sent["t_start_ns"]
        assert r["peer"] == sender and sent["peer"] == rank
        # ... and the reduce of a tile never precedes its receive; the GEMM comes before both.
        red = reduce.loc[(rank, it, tile, step)]
        assert red["t_start_ns"] >= r["t_end_ns"]
        assert gemm.loc[(rank, it, tile), "t_end_ns"] <= r["t_start_ns"]
        checked += 1
    assert checked == 4 * 2 * TILES * 3


def test_atomics_trace_pushes_every_tile_to_every_rank(live):
    ev = live["atomics"].events
    for (rank, it), d in ev.groupby(["rank", "iteration"]):
        pushes = d[d["kind"] == "push"]
        assert len(pushes) == TILES * 4 and len(d[d["kind"] == "gemm"]) == TILES
        for tile, p in pushes.groupby("tile"):
            assert sorted(p["peer"]) == [0, 1, 2, 3]
            assert p["t_start_ns"].min() >= d[(d["kind"] == "gemm") & (d["tile"] == tile)]["t_end_ns"].iloc[0]


def test_two_shot_trace_gemm_programs_never_wait_and_owners_wait_for_every_partial(live):
    t = live["two_shot"]
    ev = t.events
    W, gemm_programs = 4, SHAPE["num_sms"]
    assert t.meta["dropped_events"] == [0] * W
    assert len(ev) == 2 * t.expected_event_count()
    for (rank, it), d in ev.groupby(["rank", "iteration"]):
        gemm_lanes = d[d["program"] < gemm_programs]
        # GEMM programs never wait: they compute and publish, then may take owned tiles that are complete.
        assert set(gemm_lanes["kind"]) <= {"gemm", "publish", "take", "reduce", "broadcast"}
        assert sorted(gemm_lanes.loc[gemm_lanes["kind"] == "gemm", "tile"]) == list(range(TILES))
        for program, lane in gemm_lanes.groupby("program"):
            helped = lane[lane["kind"].isin(["take", "reduce", "broadcast"])]
            assert (helped["t_start_ns"] >= lane.loc[lane["kind"] == "publish", "t_end_ns"].max()).all()
        owned = sorted(d.loc[d["kind"] == "reduce", "tile"])   # each owned tile reduced once, by someone
        assert owned == [t for t in range(TILES) if t % W == rank]
        firsts = d[d["kind"].isin(["partial_wait", "take"])]   # one wait or take per owned tile
        assert sorted(firsts["tile"]) == owned
        waits = d[d["kind"] == "result_wait"]   # one per other owner, by the last communication program
        assert sorted(waits["peer"]) == [q for q in range(W) if q != rank] and set(waits["tile"]) == {-1}
        assert set(waits["program"]) == {gemm_programs + 2 - 1}   # (comm_sms=2)
    publish = ev[ev["kind"] == "publish"].set_index(["rank", "iteration", "tile"])
    broadcast = ev[ev["kind"] == "broadcast"].set_index(["iteration", "tile"])
    for e in ev[ev["kind"].isin(["partial_wait", "take"])].itertuples():
        # The owner's wait (or take) ends only after every rank has started publishing its partial of the tile ...
        for source in range(W):
            assert e.t_end_ns >= publish.loc[(source, e.iteration, e.tile), "t_start_ns"]
    for e in ev[ev["kind"] == "result_wait"].itertuples():
        # ... and a rank's wait for an owner's tiles ends only after that owner started writing each sum.
        owner_tiles = [t for t in range(TILES) if t % W == e.peer]
        assert e.t_end_ns >= broadcast.loc[[(e.iteration, t) for t in owner_tiles], "t_start_ns"].max()


def test_save_load_roundtrip_and_bad_files(traces, tmp_path):
    t = traces["ring"]
    for name in ("run.trace.json", "run.trace.json.gz"):
        path = tmp_path / name
        t.save(path)
        back = Trace.load(path)
        assert back.meta == json.loads(json.dumps(t.meta))
        np.testing.assert_array_equal(back.raw, t.raw)
    doc = json.loads((tmp_path / "run.trace.json").read_text())
    doc["version"] = 99
    (tmp_path / "future.json").write_text(json.dumps(doc))
    with pytest.raises(gemmar.UsageError, match="version 99; this gemmar reads version 1"):
        Trace.load(tmp_path / "future.json")
    (tmp_path / "cut.json").write_text((tmp_path / "run.trace.json").read_text()[:500])
    with pytest.raises(gemmar.UsageError, match="not a readable gemmar trace"):
        Trace.load(tmp_path / "cut.json")
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(gemmar.UsageError, match="not a gemmar trace"):
        Trace.load(tmp_path / "other.json")
    with gzip.open(tmp_path / "bad.json.gz", "wt") as f:
        f.write("{not json")
    with pytest.raises(gemmar.UsageError, match="not a readable"):
        Trace.load(tmp_path / "bad.json.gz")
    with pytest.raises(gemmar.UsageError, match="does not exist"):
        Trace.load(tmp_path / "missing.json")


@pytest.mark.parametrize("damage,needle", [
    (lambda d: d["meta"].update(m="48"), "m='48' is not an integer"),
    (lambda d: d.update(meta=[]), "its meta is list"),
    (lambda d: d["meta"].update(BLK_M=0), "BLK_M=0"),
    (lambda d: d["meta"].update(n=1e30), "n=1e+30"),
    (lambda d: d["meta"].pop("world_size"), "its meta lacks world_size"),
    (lambda d: d["events"][3].__setitem__(0, 9), "event 3 has a rank outside the world size"),
    (lambda d: d["events"][5].__setitem__(2, 99), "event 5 has a program outside the launch"),
    (lambda d: d["events"][0].__setitem__(3, 77), "event 0 has an event kind that ring does not record"),
    (lambda d: d["meta"].update(protocol={"phases": [{"name": "gemm"}]}), "its meta names algorithm .ring. and carries no readable protocol"),
    (lambda d: d["meta"].update(algorithm="mine", protocol=None), "its meta names algorithm .mine. and carries no readable protocol"),
])
def test_a_damaged_trace_is_refused_whole_on_load(traces, tmp_path, damage, needle):
    # Checked on load, not when a figure meets the bad value half-way through drawing it.
    traces["ring"].save(tmp_path / "run.trace.json")
    doc = json.loads((tmp_path / "run.trace.json").read_text())
    damage(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(gemmar.UsageError, match="is damaged: " + needle.replace("+", r"\+")):
        Trace.load(tmp_path / "bad.json")


def test_perfetto_structure(traces, tmp_path):
    t = traces["atomics"]
    doc = t.to_perfetto(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads(json.dumps(doc))
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["name"] for e in meta if e["name"] == "process_name"} == {f"rank {r}" for r in range(4)}
    assert len([e for e in meta if e["name"] == "thread_name"]) == 4 * 3
    assert len(complete) == len(t.events)
    for e in complete:
        assert {"tile", "pid_m", "pid_n", "step", "peer", "iteration"} <= set(e["args"])
        assert e["dur"] >= 0 and 0 <= e["pid"] < 4 and 0 <= e["tid"] < 3
        assert e["cat"] in ("gemm", "wait", "comm", "reduce", "store")


def test_summary_and_figures(traces, tmp_path):
    for alg, t in traces.items():
        s = t.summary()
        assert list(s.index) == [0, 1, 2, 3]
        assert (s["gemm_us"] > 0).all() and (s["span_us"] >= s["comm_wall_us"]).all()
        assert ((s["hidden_share"] >= 0) & (s["hidden_share"] <= 1)).all()
        fig = t.gantt(path=tmp_path / f"{alg}.png")
        assert (tmp_path / f"{alg}.png").stat().st_size > 10_000 and len(fig.axes) == 2
        t.tile_grid(path=tmp_path / f"{alg}-tiles.png")
        assert (tmp_path / f"{alg}-tiles.png").stat().st_size > 10_000
    # Too many lanes for one row each: the per-rank aggregate view, and zooming back to a few programs.
    t = traces["ring"]
    t.gantt(max_lanes=4, path=tmp_path / "aggregate.png")
    t.gantt(max_lanes=4, ranks=[0], programs=range(2), path=tmp_path / "zoom.png")
    with pytest.raises(gemmar.UsageError, match="iteration=5"):
        t.gantt(iteration=5)


def test_replay_states_follow_the_run(traces):
    t = traces["ring"]
    states = t.replay_states()
    first, last = states[0], states[-1]
    assert all((g <= 1).all() for g in first["tiles"])          # nothing reduced at the start
    assert all((g == 3).all() for g in last["tiles"])           # everything reduced at the end
    assert (last["flags"]["data_ready"] == 3).all() and (last["flags"]["slot_free"] == 3).all()
    # Tile states never go backwards.
    for a, b in zip(states, states[1:]):
        assert all((gb >= ga).all() for ga, gb in zip(a["tiles"], b["tiles"]))
    assert any(s["waiting"] for s in states)
    states = traces["atomics"].replay_states()
    assert all((g == 3).all() for g in states[-1]["tiles"]) and states[-1]["flags"] == {}


def test_replay_explains_two_shot_waits_and_marks_every_tile_on_every_rank(live):
    states = live["two_shot"].replay_states()
    assert all((g == 3).all() for g in states[-1]["tiles"])     # every tile reduced on every rank
    waits = [w for s in states for w in s["waiting"]]
    partial = [w for w in waits if "partial_ready" in w]
    result = [w for w in waits if "results_in" in w]
    assert partial and all(re.search(r"tile \d+ waits for partial_ready \(all 4 ranks' partials", w) for w in partial)
    assert all(re.search(r"waits for results_in \(every tile rank [0-3] owns", w) for w in result)
    assert not any("slot_free" in w or "data_ready" in w for w in waits)


def test_replay_widget_from_a_saved_trace(traces, tmp_path):
    pytest.importorskip("ipywidgets")
    traces["ring"].save(tmp_path / "r.json")
    player = Trace.load(tmp_path / "r.json").replay()   # no cluster involved
    slider = player.children[0].children[1]
    slider.value = slider.max // 2
    # The CPU trace spans seconds: its times read in ms (GPU traces, in µs), with the tile ids on the squares.
    # The words sit under the picture, in a box of fixed least height: playing, the picture does not jump.
    words = player.children[2]
    assert re.match(r"<b>t = \d+\.\d ms</b> \(under each tile id", words.value) and words.layout.min_height


def test_gantt_cli(traces, tmp_path):
    traces["ring"].save(tmp_path / "run.trace.json")
    p = subprocess.run([sys.executable, "-m", "gemmar.cli", "gantt", str(tmp_path / "run.trace.json"), "-o",
                        str(tmp_path / "g.png"), "--perfetto", str(tmp_path / "p.json"), "--tile_grid",
                        str(tmp_path / "t.png")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert all((tmp_path / f).exists() for f in ("g.png", "p.json", "t.png"))
    (tmp_path / "bad.json").write_text("garbage")
    p = subprocess.run([sys.executable, "-m", "gemmar.cli", "gantt", str(tmp_path / "bad.json")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "bad.json" in p.stderr


def test_host_schedule_matches_the_tiles_the_kernels_did(live):
    from gemmar.analysis.schedule import tile_schedule

    s = tile_schedule(SHAPE["m"], SHAPE["n"], SHAPE["BLK_M"], SHAPE["BLK_N"], SHAPE["gsize_m"], SHAPE["num_sms"])
    expected = {(r.tile, r.pid_m, r.pid_n, r.program) for r in s.itertuples()}
    for t in live.values():
        gemm = t.events[t.events["kind"] == "gemm"]
        for rank, d in gemm.groupby("rank"):
            assert {(e.tile, e.pid_m, e.pid_n, e.program) for e in d.itertuples()} == expected


def test_launch_skew_is_told_apart_and_legends_list_only_what_is_drawn(traces, tmp_path):
    s = traces["ring"].summary()
    assert (s.launch_skew_us >= 0).all() and s.launch_skew_us.min() == 0   # the first rank to start: no skew
    fig = traces["atomics"].gantt(path=tmp_path / "g.png")
    names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    # atomics never waits or reduces; its 'store' events zero the next launch's C, and say so.
    assert "waiting" not in names and "reducing" not in names and "zeroing the next launch's C" in names
    assert "4 ranks x 3 programs" in fig.axes[0].get_title()


def test_per_device_clocks_are_aligned_at_every_iteration():
    """Ranks on different GPUs read different clocks, which drift: each iteration is aligned on the barrier
    before it. Here rank 1's clock is 5 s ahead and gains 1 ms between the iterations' barriers."""
    from gemmar import Result, RunConfig
    from gemmar.kernels.gemm import GEMM_PHASE
    from gemmar.runtime.results import RankResult

    gemm = GEMM_PHASE.kind_id
    config = RunConfig(m=16, n=16, k=16, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=1, world_size=2, iterations=2,
                       trace=True, algorithm="ring")

    def rank(r, starts):   # one gemm event per iteration, 100 us after that iteration's barrier
        events = np.array([[r, it, 0, gemm, 0, 0, 0, 0, -1, s + 100_000, s + 200_000] for it, s in enumerate(starts)])
        return RankResult(r, [0.0, 0.0], [1e-3, 1e-3], 1.0, starts[0], events=events, iteration_starts_ns=starts)

    ranks = [rank(0, [1_000_000, 3_000_000]), rank(1, [5_001_000_000, 5_004_000_000])]
    trace = Result(config, "cuda", ranks).trace
    e = trace.events.sort_values(["iteration", "rank"])
    # Both ranks' events sit 100 us after their iteration's start, on rank 0's timeline (iteration 1 at 2 ms).
    assert list(e.t_start_ns) == [100_000, 100_000, 2_100_000, 2_100_000]
    assert trace.meta["clock"] == "per-device, aligned at the barrier before each iteration"
    ranks[1].iteration_starts_ns = []   # untraced iterations: aligned on the first barrier only
    assert list(Result(config, "cuda", ranks).trace.events.sort_values(["iteration", "rank"]).t_start_ns) == \
        [100_000, 100_000, 2_100_000, 3_100_000]


def test_every_gemm_bar_of_a_small_run_carries_its_tile_id():
    """Issue 37: notebook 2's chart labelled a few GEMM bars only (a fixed 22-pixel threshold); a bar now needs
    room for its digits only, so every GEMM bar of this 4-rank, 9-tile run says which tile it is."""
    trace = Trace.load(os.path.join(DATA, "cpu-atomics-4ranks-48x40x40.trace.json.gz"))
    gemm = trace.iteration(-1).query("group == 'gemm'")
    fig = trace.gantt()
    labels = sorted(t.get_text() for t in fig.axes[0].texts)
    assert labels == sorted(str(tile) for tile in gemm["tile"]), labels
