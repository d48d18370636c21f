"""Host side of the trace: every rank's per-tile events on one time axis, saved, drawn and replayed.

Each kernel records complete events (``events.py``): a kind (gemm, slot_wait, send, signal, recv_wait,
reduce, store, push), the tile and its (pid_m, pid_n), the ring step, the peer rank, and start and end
times from ``device.now()``.

**Time alignment.** Before the first launch every rank passes a barrier, and the barrier kernel stamps
``now()`` as the rank leaves it. On CPU, ``now()`` is the machine's CLOCK_MONOTONIC, one clock for every
process: all events keep their order across ranks, and time zero is the earliest exit stamp. On GPUs each
device has its own ``%globaltimer``: all ranks leave the barrier within the time it takes the last
arrival to become visible, so each rank's events are shifted to start from its *own* exit stamp, which
puts them on one axis to within that exit skew (about a microsecond over NVLink).
"""

import gzip
import json
import os

import numpy as np
import pandas as pd

from .errors import UsageError
from .events import KINDS

FORMAT = "gemmar-trace"
VERSION = 1
RAW_COLUMNS = ["rank", "iteration", "program", "kind_id", "tile", "pid_m", "pid_n", "step", "peer", "t_start_ns",
               "t_end_ns"]
PHASE_COLORS = {"gemm": "#4C72B0", "wait": "#DD8452", "comm": "#55A868", "reduce": "#8172B3", "store": "#937860"}
PHASE_LABELS = {"gemm": "GEMM", "wait": "waiting", "comm": "communicating", "reduce": "reducing",
                "store": "storing C"}


def _interval_union(starts, ends):
    """Merge intervals; returns sorted disjoint (starts, ends) arrays."""
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts)
    s, e = np.asarray(starts, float)[order], np.asarray(ends, float)[order]
    out_s, out_e = [s[0]], [e[0]]
    for a, b in zip(s[1:], e[1:]):
        if a <= out_e[-1]:
            out_e[-1] = max(out_e[-1], b)
        else:
            out_s.append(a)
            out_e.append(b)
    return np.array(out_s), np.array(out_e)


def _overlap(a, b):
    """Total length of the intersection of two disjoint-sorted interval sets."""
    total, i, j = 0.0, 0, 0
    (a_s, a_e), (b_s, b_e) = a, b
    while i < len(a_s) and j < len(b_s):
        lo, hi = max(a_s[i], b_s[j]), min(a_e[i], b_e[j])
        total += max(0.0, hi - lo)
        if a_e[i] < b_e[j]:
            i += 1
        else:
            j += 1
    return total


def time_unit(span_us):
    """(divisor, label): µs for GPU-scale spans, ms for the interpreter's seconds-long ones."""
    return (1.0, "µs") if span_us < 20_000 else (1e3, "ms")


class Trace:
    """Events of one run from every rank. ``events`` is a DataFrame, one row per event, times in µs."""

    def __init__(self, raw, meta):
        raw = np.asarray(raw, dtype=np.int64).reshape(-1, len(RAW_COLUMNS))
        self.meta = dict(meta)
        df = pd.DataFrame(raw, columns=RAW_COLUMNS)
        df["kind"] = df["kind_id"].map(lambda k: KINDS.get(int(k), ("?", "?"))[0])
        df["phase"] = df["kind_id"].map(lambda k: KINDS.get(int(k), ("?", "?"))[1])
        df["start_us"] = df["t_start_ns"] / 1e3
        df["end_us"] = df["t_end_ns"] / 1e3
        df["duration_us"] = df["end_us"] - df["start_us"]
        self.raw = raw
        self.events = df.sort_values(["t_start_ns", "rank", "program"], kind="stable").reset_index(drop=True)

    # -- building, saving, loading --------------------------------------------------------------------
    @classmethod
    def from_result(cls, result):
        cfg = result.config
        if not cfg.trace:
            raise UsageError("this run was not traced: run it with trace=True (CLI: -t/--trace_tiles)")
        shared_clock = result.backend == "cpu"
        first_exit = min(int(out["t_zero_ns"]) for out in result.ranks)
        blocks = []
        for r, out in enumerate(result.ranks):
            ev = np.asarray(out["events"], np.int64).reshape(-1, 10)
            block = np.empty((len(ev), len(RAW_COLUMNS)), np.int64)
            block[:, 0] = r
            block[:, 1:] = ev
            block[:, -2:] -= first_exit if shared_clock else int(out["t_zero_ns"])
            blocks.append(block)
        info = result.info or [{}] * cfg.world_size
        meta = dict(algorithm=cfg.algorithm, m=cfg.m, n=cfg.n, k=cfg.k, datatype=cfg.datatype,
                    BLK_M=cfg.BLK_M, BLK_N=cfg.BLK_N, BLK_K=cfg.BLK_K, gsize_m=cfg.gsize_m, num_sms=cfg.num_sms,
                    world_size=cfg.world_size, iterations=cfg.iterations, backend=result.backend,
                    mistake=result.mistake, clock="shared" if shared_clock else "per-device, aligned at a barrier",
                    devices=[i.get("device") for i in info],
                    torch=info[0].get("torch"), triton=info[0].get("triton"),
                    dropped_events=[int(out.get("dropped_events", 0)) for out in result.ranks],
                    seconds=[list(map(float, out["seconds"])) for out in result.ranks])
        if any(meta["dropped_events"]):  # cannot happen unless events_per_tile is wrong; never silently
            import warnings

            warnings.warn(f"trace is incomplete: events dropped per rank {meta['dropped_events']} "
                          f"(trace buffer too small)", stacklevel=2)
        return cls(np.concatenate(blocks) if blocks else np.zeros((0, len(RAW_COLUMNS))), meta)

    def save(self, path):
        """Write the versioned JSON file (gzip-compressed when ``path`` ends with .gz)."""
        doc = dict(format=FORMAT, version=VERSION, meta=self.meta, columns=RAW_COLUMNS, events=self.raw.tolist())
        text = json.dumps(doc, separators=(",", ":"))
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "wt") as f:
            f.write(text)
        return path

    @classmethod
    def load(cls, path):
        """Read a file written by :meth:`save`. A missing, corrupt or foreign file is a UsageError."""
        if not os.path.exists(path):
            raise UsageError(f"trace file {path} does not exist")
        opener = gzip.open if str(path).endswith(".gz") else open
        try:
            with opener(path, "rt") as f:
                doc = json.load(f)
        except (OSError, ValueError, EOFError) as e:
            raise UsageError(f"trace file {path} is not a readable gemmar trace ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:120]})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise UsageError(f"{path} is not a gemmar trace (no \"format\": \"{FORMAT}\" field)")
        if doc.get("version") != VERSION:
            raise UsageError(f"trace file {path} has version {doc.get('version')!r}; this gemmar reads version "
                             f"{VERSION}: re-record it or use the gemmar that wrote it")
        if doc.get("columns") != RAW_COLUMNS or not isinstance(doc.get("events"), list):
            raise UsageError(f"trace file {path} is damaged: its columns or events are not the ones version "
                             f"{VERSION} writes")
        try:
            return cls(doc["events"], doc.get("meta", {}))
        except (ValueError, TypeError) as e:
            raise UsageError(f"trace file {path} is damaged: {str(e)[:120]}") from None

    def __repr__(self):
        m = self.meta
        return (f"Trace({m.get('algorithm')}, {m.get('m')}x{m.get('n')}x{m.get('k')}, "
                f"{m.get('world_size')} ranks x {m.get('num_sms')} programs, {len(self.events)} events)")

    # -- selections and figures -----------------------------------------------------------------------
    def iteration(self, iteration=-1):
        """Events of one iteration (negative counts from the end), times from that iteration's start."""
        its = sorted(self.events["iteration"].unique())
        if not its:
            return self.events.copy()
        if not -len(its) <= iteration < len(its):
            raise UsageError(f"iteration={iteration} is out of range: this trace has iterations 0..{len(its) - 1}")
        df = self.events[self.events["iteration"] == its[iteration]].copy()
        t0 = df["start_us"].min()
        df["start_us"] -= t0
        df["end_us"] -= t0
        return df

    def expected_event_count(self, rank=None):
        """How many events a complete trace of one iteration has, per rank (from the run's shape)."""
        m = self.meta
        tiles = -(-m["m"] // m["BLK_M"]) * -(-m["n"] // m["BLK_N"])
        W = m["world_size"]
        per_tile = 2 + 5 * (W - 1) if m["algorithm"] == "ring" else 2 + W
        return tiles * per_tile

    def summary(self, iteration=-1):
        """Per rank: GEMM, waiting, communicating and reducing time (µs summed over programs), the span,
        and the share of communication time (comm + wait + reduce, merged over programs) hidden under GEMM
        (some program of the same rank was in a GEMM at that moment)."""
        df = self.iteration(iteration)
        rows = []
        for rank, d in df.groupby("rank"):
            busy = {p: d.loc[d["phase"] == p, "duration_us"].sum() for p in PHASE_COLORS}
            gemm = _interval_union(d.loc[d["phase"] == "gemm", "start_us"], d.loc[d["phase"] == "gemm", "end_us"])
            comm_rows = d["phase"].isin(["comm", "wait", "reduce"])
            comm = _interval_union(d.loc[comm_rows, "start_us"], d.loc[comm_rows, "end_us"])
            comm_len = float(np.sum(comm[1] - comm[0]))
            rows.append(dict(rank=rank, span_us=d["end_us"].max() - d["start_us"].min(), gemm_us=busy["gemm"],
                             wait_us=busy["wait"], comm_us=busy["comm"], reduce_us=busy["reduce"],
                             comm_wall_us=comm_len,
                             hidden_share=_overlap(gemm, comm) / comm_len if comm_len > 0 else float("nan")))
        return pd.DataFrame(rows).set_index("rank")

    def gantt(self, iteration=-1, max_lanes=48, ranks=None, programs=None, path=None, figsize=None):
        """Gantt chart: one lane per (rank, program), bars coloured by phase, tile ids where they fit.

        With more lanes than ``max_lanes`` (e.g. 2 ranks x 132 programs) each rank becomes one panel that
        shows how many programs are in each phase over time; pass ``programs=range(a, b)`` to zoom back
        to individual lanes. Per-rank summary figures go in the lower panel.
        """
        import matplotlib.pyplot as plt

        df = self.iteration(iteration)
        if ranks is not None:
            df = df[df["rank"].isin(list(ranks))]
        if programs is not None:
            df = df[df["program"].isin(list(programs))]
        if df.empty:
            raise UsageError("no events to draw for this selection of iteration, ranks and programs")
        lanes = sorted(set(zip(df["rank"], df["program"])))
        aggregate = len(lanes) > max_lanes
        n_rows = df["rank"].nunique() if aggregate else len(lanes)
        height = figsize[1] if figsize else min(14, 1.6 + 0.32 * n_rows + (1.2 * n_rows if aggregate else 0))
        width = figsize[0] if figsize else 13
        fig, (ax, ax_sum) = plt.subplots(2, 1, figsize=(width, height + 1.8),
                                         gridspec_kw=dict(height_ratios=[max(height, 2), 1.6]))
        scale, unit = time_unit(df["end_us"].max())
        df = df.assign(start_us=df["start_us"] / scale, end_us=df["end_us"] / scale,
                       duration_us=df["duration_us"] / scale)
        span = df["end_us"].max()
        if aggregate:
            self._draw_aggregate(ax, df, span)
        else:
            self._draw_lanes(ax, df, lanes, span, width)
        m = self.meta
        it = sorted(self.events["iteration"].unique())[iteration] if len(self.events) else 0
        ax.set_title(f"{m.get('algorithm')} all-reduce, M x N x K = {m.get('m')}x{m.get('n')}x{m.get('k')} "
                     f"{m.get('datatype')} (K split over the ranks), "
                     f"blocks {m.get('BLK_M')}x{m.get('BLK_N')}x{m.get('BLK_K')}, {m.get('world_size')} ranks x "
                     f"{m.get('num_sms')} programs, {m.get('backend')} backend, iteration {it}")
        ax.set_xlabel(f"time since the iteration started ({unit})")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLORS.values()]
        ax.legend(handles, list(PHASE_LABELS.values()), loc="upper right", fontsize=8, ncol=5, framealpha=0.9)
        self._draw_summary(ax_sum, iteration, ranks, scale, unit)
        fig.tight_layout()
        if path:
            fig.savefig(path, dpi=110)
        return fig

    def _draw_lanes(self, ax, df, lanes, span, width_in):
        row_of = {lane: i for i, lane in enumerate(lanes)}
        y = df.apply(lambda e: row_of[(e["rank"], e["program"])], axis=1).to_numpy()
        colors = df["phase"].map(PHASE_COLORS).fillna("#999999").to_numpy()
        ax.barh(y, df["duration_us"].clip(lower=span * 1e-4), left=df["start_us"], height=0.8, color=colors,
                edgecolor="none")
        px_per_us = width_in * 80 / max(span, 1e-9)
        for (_, e), row in zip(df.iterrows(), y):
            if e["phase"] == "gemm" and e["duration_us"] * px_per_us > 22:
                ax.text(e["start_us"] + e["duration_us"] / 2, row, str(e["tile"]), ha="center", va="center",
                        fontsize=7, color="white")
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([f"rank {r} · prog {p}" for r, p in lanes], fontsize=7)
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        for i in range(1, len(lanes)):
            if lanes[i][0] != lanes[i - 1][0]:
                ax.axhline(i - 0.5, color="black", lw=0.8)
        ax.set_xlim(0, span * 1.01)

    def _draw_aggregate(self, ax, df, span, bins=400):
        edges = np.linspace(0, span, bins + 1)
        mids = (edges[:-1] + edges[1:]) / 2
        ranks = sorted(df["rank"].unique())
        offset = 0.0
        yticks, ylabels = [], []
        for rank in ranks[::-1]:
            d = df[df["rank"] == rank]
            n_prog = d["program"].nunique()
            bottom = np.zeros(bins)
            for phase, color in PHASE_COLORS.items():
                p = d[d["phase"] == phase]
                count = np.zeros(bins)
                for s, e in zip(p["start_us"], p["end_us"]):
                    count += np.clip(np.minimum(edges[1:], e) - np.maximum(edges[:-1], s), 0, None) / np.diff(edges)
                ax.fill_between(mids, offset + bottom / n_prog, offset + (bottom + count) / n_prog, color=color,
                                step="mid", lw=0)
                bottom += count
            yticks.append(offset + 0.5)
            ylabels.append(f"rank {rank}\n({n_prog} programs)")
            offset += 1.15
        ax.set_yticks(yticks)
        ax.set_yticklabels(ylabels, fontsize=8)
        ax.set_ylabel("share of programs in each phase")
        ax.set_xlim(0, span)

    def _draw_summary(self, ax, iteration, ranks, scale, unit):
        s = self.summary(iteration)
        if ranks is not None:
            s = s.loc[[r for r in s.index if r in set(ranks)]]
        ax.axis("off")
        header = ["rank"] + [f"{name} ({unit})" for name in ("span", "GEMM", "waiting", "comm", "reduce")] + \
            ["comm hidden under GEMM"]
        cells = [[str(r)] + [f"{x / scale:.1f}" for x in (v.span_us, v.gemm_us, v.wait_us, v.comm_us, v.reduce_us)]
                 + ["-" if np.isnan(v.hidden_share) else f"{100 * v.hidden_share:.0f} %"] for r, v in s.iterrows()]
        table = ax.table(cellText=cells, colLabels=header, loc="center", cellLoc="center")
        table.auto_set_font_size(False)
        table.set_fontsize(8)
        table.scale(1, 1.1)
        ax.set_title("per rank: times summed over programs; hidden = share of the rank's communication wall "
                     "time during which one of its programs was in a GEMM", fontsize=9)

    def tile_grid(self, iteration=-1, path=None):
        """Heat maps per rank: which program did which tile, and when each tile's result was stored."""
        import matplotlib.pyplot as plt

        df = self.iteration(iteration)
        m = self.meta
        tm, tn = -(-m["m"] // m["BLK_M"]), -(-m["n"] // m["BLK_N"])
        ranks = sorted(df["rank"].unique())
        scale, unit = time_unit(df["end_us"].max())
        fig, axes = plt.subplots(2, len(ranks), figsize=(3.2 * len(ranks) + 1, 6.2), squeeze=False)
        for c, rank in enumerate(ranks):
            d = df[df["rank"] == rank]
            program = np.full((tm, tn), np.nan)
            finish = np.full((tm, tn), np.nan)
            for _, e in d[d["kind"] == "gemm"].iterrows():
                program[e["pid_m"], e["pid_n"]] = e["program"]
            done = d[d["kind"] == ("store" if m["algorithm"] == "ring" else "push")]
            for _, e in done.iterrows():
                cur = finish[e["pid_m"], e["pid_n"]]
                finish[e["pid_m"], e["pid_n"]] = e["end_us"] if np.isnan(cur) else max(cur, e["end_us"])
            im0 = axes[0, c].imshow(program, cmap="tab20", vmin=0, vmax=max(19, m["num_sms"] - 1))
            axes[0, c].set_title(f"rank {rank}: program per tile", fontsize=9)
            im1 = axes[1, c].imshow(finish / scale, cmap="viridis")
            axes[1, c].set_title(f"rank {rank}: tile reduced at ({unit})", fontsize=9)
            if tm * tn <= 64:
                for i in range(tm):
                    for j in range(tn):
                        if not np.isnan(program[i, j]):
                            axes[0, c].text(j, i, int(program[i, j]), ha="center", va="center", fontsize=7)
            fig.colorbar(im1, ax=axes[1, c], fraction=0.046)
            for ax in axes[:, c]:
                ax.set_xlabel("pid_n")
                ax.set_ylabel("pid_m")
        fig.colorbar(im0, ax=axes[0, -1], fraction=0.046, label="program")
        fig.suptitle(f"{m['algorithm']}: tile schedule (GROUP_SIZE_M={m['gsize_m']}, {m['num_sms']} programs)")
        fig.tight_layout()
        if path:
            fig.savefig(path, dpi=110)
        return fig

    # -- Perfetto -------------------------------------------------------------------------------------
    def to_perfetto(self, path=None):
        """Chrome/Perfetto trace JSON: one process per rank, one thread per program, one complete event per
        phase with tile ids in args. Open it at ui.perfetto.dev. Returns the dict (and writes ``path``)."""
        events = []
        for rank in sorted(self.events["rank"].unique()):
            events.append(dict(ph="M", name="process_name", pid=int(rank), tid=0, args=dict(name=f"rank {rank}")))
            for program in sorted(self.events.loc[self.events["rank"] == rank, "program"].unique()):
                events.append(dict(ph="M", name="thread_name", pid=int(rank), tid=int(program),
                                   args=dict(name=f"program {program}")))
        for e in self.events.itertuples():
            events.append(dict(ph="X", name=f"{e.kind} t{e.tile}", cat=e.phase, pid=int(e.rank), tid=int(e.program),
                               ts=float(e.start_us), dur=float(max(e.duration_us, 0.0)),
                               args=dict(tile=int(e.tile), pid_m=int(e.pid_m), pid_n=int(e.pid_n), step=int(e.step),
                                         peer=int(e.peer), iteration=int(e.iteration))))
        doc = dict(traceEvents=events, displayTimeUnit="ns", metadata=dict(self.meta, format=FORMAT))
        if path:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc

    # -- step-through replay --------------------------------------------------------------------------
    def replay_states(self, iteration=-1):
        """The run as a list of states, one per event boundary in time order (all ranks merged).

        Each state: ``time_us``; ``tiles[rank]``, a (tiles_m x tiles_n) array of 0 not started, 1 in GEMM,
        2 partial (GEMM done, not yet reduced), 3 reduced; for the ring, ``data_ready[rank][tile]`` and
        ``slot_free[rank][tile]`` (the flag counters as the events imply them); ``waiting``, one line per
        program that is waiting at that moment; ``event``, what just happened.
        """
        from .replay import build_states

        return build_states(self, iteration)

    def replay(self, iteration=-1):
        """An ipywidgets player (slider + play button) over :meth:`replay_states`."""
        from .replay import ReplayWidget

        return ReplayWidget(self, iteration).widget
