"""Host side of the trace: every rank's per-tile events on one time axis, saved, drawn and replayed.

Each kernel records complete events (``events.py``): a kind (its algorithm's phases: gemm, slot_wait,
send, ...), the tile and its (pid_m, pid_n), the step, the peer rank, and start and end times from
``device.now()``. A trace carries its algorithm's protocol (``AlgorithmSpec.describe()``: the phases,
what each wait waits for, when a tile is done) in its meta, so a user's algorithm's trace reads, draws
and replays anywhere, without its spec.

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

from ..errors import UsageError
from ..kernels.events import COLUMNS
from .plots import GROUP_COLORS, plural
from .trace_checks import check_events, checked_meta, protocol

FORMAT = "gemmar-trace"
VERSION = 1
RAW_COLUMNS = list(COLUMNS)


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


# The most tiles a tile grid or a replay draws (their arrays are ranks x tiles; a 2**20 x 2**20 C in 16 x 16
# tiles once asked for 32 GiB).
MAX_GRID_TILES = 1 << 20

# The largest trace file read: 400k events (more than the largest GPU runs record) take ~60 MB.
MAX_TRACE_BYTES = 512 << 20


class Trace:
    """Events of one run from every rank. ``events`` is a DataFrame, one row per event, times in µs."""

    FORMAT = FORMAT

    def __init__(self, raw, meta):
        raw = np.asarray(raw, dtype=np.int64).reshape(-1, len(RAW_COLUMNS))
        self.meta = dict(meta)
        kinds = {p["kind_id"]: (p["name"], p["group"]) for p in self.protocol["phases"]}
        df = pd.DataFrame(raw, columns=RAW_COLUMNS)
        df["kind"] = df["kind_id"].map(lambda k: kinds.get(int(k), ("?", "?"))[0])
        df["group"] = df["kind_id"].map(lambda k: kinds.get(int(k), ("?", "?"))[1])
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
        first_exit = min(int(out.t_zero_ns) for out in result.ranks)
        blocks = []
        for out in result.ranks:
            block = np.array(out.events, np.int64).reshape(-1, len(RAW_COLUMNS))
            if shared_clock:   # one clock for all ranks (CLOCK_MONOTONIC): nothing to align
                block[:, -2:] -= first_exit
            else:
                block[:, -2:] -= cls._clock_offsets(result, out)[block[:, RAW_COLUMNS.index("iteration")]][:, None]
            blocks.append(block)
        info = result.info or [{}] * cfg.world_size
        spec = cfg.spec
        meta = dict(algorithm=cfg.algorithm, protocol=spec.describe(),
                    expected_events=[spec.expected_events(cfg, r) for r in range(cfg.world_size)],
                    m=cfg.m, n=cfg.n, k=cfg.k, datatype=cfg.datatype,
                    BLK_M=cfg.BLK_M, BLK_N=cfg.BLK_N, BLK_K=cfg.BLK_K, gsize_m=cfg.gsize_m, num_sms=cfg.num_sms,
                    comm_sms=cfg.comm_sms if spec.comm_programs else 0,
                    world_size=cfg.world_size, iterations=cfg.iterations, backend=result.backend,
                    mistake=result.mistake,
                    clock="shared" if shared_clock else "per-device, aligned at the barrier before each iteration",
                    devices=[i.get("device") for i in info],
                    torch=info[0].get("torch"), triton=info[0].get("triton"),
                    dropped_events=[int(out.dropped_events) for out in result.ranks],
                    seconds=[list(map(float, out.seconds)) for out in result.ranks])
        if cfg.sanitize and shared_clock:
            # The sanitizer's races, on the trace's clock (cpu ranks: the same CLOCK_MONOTONIC), to draw.
            meta["races"] = [dict(text=race.text, sides=race.sides(first_exit)) for race in result.sanitizer.races]
        if any(meta["dropped_events"]):  # cannot happen unless events_per_program is wrong; never silently
            import warnings

            warnings.warn(f"trace is incomplete: events dropped per rank {meta['dropped_events']} "
                          f"(trace buffer too small)", stacklevel=2)
        return cls(np.concatenate(blocks) if blocks else np.zeros((0, len(RAW_COLUMNS))), meta)

    @staticmethod
    def _clock_offsets(result, out):
        """Per-device clocks: per iteration, what to subtract from ``out``'s clock. Each rank's iteration i
        starts at its own exit from the barrier before it, placed at rank 0's time for that exit (so the
        iterations keep rank 0's spacing); runs without a barrier per iteration align on the first."""
        starts = [int(t) for t in (out.iteration_starts_ns or [out.t_zero_ns])]
        anchor = [int(t) for t in (result.ranks[0].iteration_starts_ns or [result.ranks[0].t_zero_ns])]
        offsets = [mine - (anchor[i] - anchor[0]) for i, mine in enumerate(starts)]
        offsets += [offsets[-1]] * (result.config.iterations - len(offsets))
        return np.array(offsets, np.int64)

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
        if not os.path.isfile(path):   # a FIFO would block, a device (/dev/zero) never end
            raise UsageError(f"trace file {path} is not a regular file")
        opener = gzip.open if str(path).endswith(".gz") else open
        try:
            with opener(path, "rb") as f:
                data = f.read(MAX_TRACE_BYTES + 1)   # (gzip: the size once unpacked, so no bomb fills memory)
            if len(data) > MAX_TRACE_BYTES:
                raise UsageError(f"trace file {path} holds more than {MAX_TRACE_BYTES >> 20} MiB of JSON: gemmar "
                                 f"writes far less for any run it can draw")
            doc = json.loads(data)
        except (OSError, ValueError, EOFError, RecursionError) as e:
            what = "nested too deep" if isinstance(e, RecursionError) else str(e).splitlines()[0][:120]
            raise UsageError(f"trace file {path} is not a readable gemmar trace ({type(e).__name__}: {what})") \
                from None
        from . import iris_trace

        if iris_trace.is_iris_trace(doc):   # Iris's tracing.export(): drawn like gemmar's own
            return cls(*iris_trace.read(doc, path))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise UsageError(f"{path} is not a gemmar trace (no \"format\": \"{FORMAT}\" field)")
        if doc.get("version") != VERSION:
            raise UsageError(f"trace file {path} has version {doc.get('version')!r}; this gemmar reads version "
                             f"{VERSION}: re-record it or use the gemmar that wrote it")
        if doc.get("columns") != RAW_COLUMNS or not isinstance(doc.get("events"), list):
            raise UsageError(f"trace file {path} is damaged: its columns or events are not the ones version "
                             f"{VERSION} writes")
        try:
            trace = cls(doc["events"], checked_meta(doc.get("meta")))
            check_events(trace)
        except (ValueError, TypeError, OverflowError, UsageError) as e:
            raise UsageError(f"trace file {path} is damaged: {str(e)[:400]}") from None
        return trace

    def __repr__(self):
        m = self.meta
        if m.get("source") == "iris":
            return f"Trace({m['algorithm']}, {plural(m['world_size'], 'rank')} x {plural(m['num_sms'], 'program')}, {len(self.events)} events)"
        comm = f" + {m['comm_sms']} communication" if m.get("comm_sms") else ""
        from .plots import _k_per_rank

        split = f" (K {_k_per_rank(m['k'], m['world_size'])})" if isinstance(m.get("k"), int) and m.get("world_size") else ""
        return (f"Trace({m.get('algorithm')}, {m.get('m')}x{m.get('n')}x{m.get('k')}{split}, "
                f"{plural(m.get('world_size'), 'rank')} x {m.get('num_sms')}{comm} programs, {len(self.events)} events)")

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

    @property
    def tiles(self):
        """(tiles along M, tiles along N) of the run's C."""
        m = self.meta
        return -(-m["m"] // m["BLK_M"]), -(-m["n"] // m["BLK_N"])

    @property
    def protocol(self):
        """The algorithm's phases, done rule, flags and legend labels (``AlgorithmSpec.describe()``)."""
        return protocol(self.meta)

    def check_grid_drawable(self):
        """UsageError (one line) when the tile grid is too large to draw or replay."""
        tm, tn = self.tiles
        if tm * tn > MAX_GRID_TILES:
            raise UsageError(f"the tile grid has {tm} x {tn} tiles, too many to draw or replay: at most "
                             f"{MAX_GRID_TILES} ({int(MAX_GRID_TILES ** 0.5)} x {int(MAX_GRID_TILES ** 0.5)})")

    def expected_event_count(self, rank=None):
        """How many events a complete trace of one iteration has: on ``rank``, or on all ranks together
        (None when the algorithm's spec does not say)."""
        W = self.meta["world_size"]
        counts = self.meta.get("expected_events")
        if counts is None:   # a file from before traces carried the count: a built-in algorithm
            from ..algorithms import get
            from ..config import RunConfig

            config = RunConfig(**{k: self.meta[k] for k in ("algorithm", "m", "n", "k", "BLK_M", "BLK_N", "num_sms",
                                                            "world_size")}, comm_sms=self.meta.get("comm_sms") or 1)
            counts = [get(self.meta["algorithm"]).expected_events(config, r) for r in range(W)]
        ranks = range(W) if rank is None else [rank]
        return None if any(counts[r] is None for r in ranks) else sum(counts[r] for r in ranks)

    def summary(self, iteration=-1):
        """Per rank: the launch skew (its first event after the first rank's, µs), GEMM, waiting,
        communicating and reducing time (µs summed over programs), the span,
        and the share of communication time (comm + wait + reduce, merged over programs) hidden under GEMM
        (some program of the same rank was in a GEMM at that moment)."""
        df = self.iteration(iteration)
        first_start = df["start_us"].min() if len(df) else 0.0
        rows = []
        for rank, d in df.groupby("rank"):
            busy = {p: d.loc[d["group"] == p, "duration_us"].sum() for p in GROUP_COLORS}
            gemm = _interval_union(d.loc[d["group"] == "gemm", "start_us"], d.loc[d["group"] == "gemm", "end_us"])
            comm_rows = d["group"].isin(["comm", "wait", "reduce"])
            comm = _interval_union(d.loc[comm_rows, "start_us"], d.loc[comm_rows, "end_us"])
            comm_len = float(np.sum(comm[1] - comm[0]))
            # Launch skew: how long after the first rank's first event this rank's kernel began at all. Time
            # a rank spends not yet launched is not protocol waiting, though its peers may wait for it.
            rows.append(dict(rank=rank, launch_skew_us=d["start_us"].min() - first_start,
                             span_us=d["end_us"].max() - d["start_us"].min(), gemm_us=busy["gemm"],
                             wait_us=busy["wait"], comm_us=busy["comm"], reduce_us=busy["reduce"],
                             comm_wall_us=comm_len,
                             hidden_share=_overlap(gemm, comm) / comm_len if comm_len > 0 else float("nan")))
        return pd.DataFrame(rows).set_index("rank")

    def launches(self):
        """Per iteration (one launch of every rank): its span (µs, the first event of any rank to the last),
        how long it went on after the last GEMM tile of any rank (``tail_us``, and ``tail_share`` of the
        span), and the gaps between consecutive ranks' first events (``start_gaps_us``: how far apart the
        host launched them)."""
        rows = []
        for iteration, d in self.events.groupby("iteration"):
            start, end = d["start_us"].min(), d["end_us"].max()
            last_gemm = d.loc[d["kind"] == "gemm", "end_us"].max()
            firsts = d.groupby("rank")["start_us"].min().sort_index().to_numpy()
            rows.append(dict(iteration=int(iteration), span_us=end - start, tail_us=end - last_gemm,
                             tail_share=(end - last_gemm) / (end - start), start_gaps_us=np.diff(firsts).tolist()))
        return pd.DataFrame(rows).set_index("iteration")

    def event_medians(self):
        """The median duration (µs) of each kind of event, the first iteration (whose launch also loaded
        the kernels) left out when there are others."""
        d = self.events
        d = d[d["iteration"] > 0] if (d["iteration"] > 0).any() else d
        return (d["end_us"] - d["start_us"]).groupby(d["kind"]).median()

    def gantt(self, iteration=-1, max_lanes=48, ranks=None, programs=None, path=None, figsize=None, show=True):
        """Gantt chart: one lane per (rank, program), bars coloured by group (see ``plots.gantt``); in a
        notebook shown under the cell, whatever the kernel's matplotlib state (``show=False``: not)."""
        from .plots import gantt

        return gantt(self, iteration, max_lanes, ranks, programs, path, figsize, show)

    def tile_grid(self, iteration=-1, path=None, show=True):
        """Heat maps per rank: which program did which tile, and when each tile was reduced (shown as
        :meth:`gantt` is)."""
        from .plots import tile_grid

        return tile_grid(self, iteration, path, show)

    def to_perfetto(self, path=None):
        """Chrome/Perfetto trace JSON (see ``perfetto.to_perfetto``); open it at ui.perfetto.dev."""
        from .perfetto import to_perfetto

        return to_perfetto(self, path)

    # -- step-through replay --------------------------------------------------------------------------
    def replay_states(self, iteration=-1):
        """The run as a list of states, one per event boundary in time order (all ranks merged).

        Each state: ``time_us``; ``tiles[rank]``, a (tiles_m x tiles_n) array of 0 not started, 1 in GEMM,
        2 partial (GEMM done, not yet reduced), 3 reduced; for the ring, ``data_ready[rank][tile]`` and
        ``slot_free[rank][tile]`` (the flag counters as the events imply them); ``waiting``, one line per
        program that is waiting at that moment; ``event``, what just happened; ``races``, the sanitizer's race
        accesses since the previous state (sanitize=True runs; the player shows them in red).
        """
        from .replay import build_states

        return build_states(self, iteration)

    def replay(self, iteration=-1):
        """An ipywidgets player (slider + play button) over :meth:`replay_states`."""
        from .replay import ReplayWidget

        return ReplayWidget(self, iteration).widget
