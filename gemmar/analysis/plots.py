"""Figures of a Trace: the Gantt chart (lanes, or per-rank aggregates when there are many programs), the
per-rank summary table under it, and the tile-grid heat maps."""

import numpy as np

from ..errors import UsageError
from .figures import (drawn_as_written, finish_figure, plain_text, plural, program_colorbar,  # noqa: F401
                      program_colormap, time_unit)   # (the rest of the package imports them from here)

GROUP_COLORS = {"gemm": "#4C72B0", "wait": "#DD8452", "comm": "#55A868", "reduce": "#8172B3", "store": "#937860"}
GROUP_LABELS = {"gemm": "GEMM", "wait": "waiting", "comm": "communicating", "reduce": "reducing",
                "store": "storing C"}


def phase_labels(protocol):
    """What each colour means in this algorithm's Gantt: the spec's own words where a group is a different act
    in it (atomics' 'store' zeroes the next launch's C)."""
    return {**GROUP_LABELS, **protocol.get("labels", {})}


MAX_GRID_CELLS = 1 << 22     # tile-grid cells (ranks x tiles) one figure draws
GRID_COLUMNS = 8             # ranks side by side in the tile grid; more ranks go on further rows


@drawn_as_written
def gantt(trace, iteration=-1, max_lanes=48, ranks=None, programs=None, path=None, figsize=None, show=True):
    """Gantt chart: one lane per (rank, program), bars coloured by the phase's group, tile ids where they fit.

    With more lanes than ``max_lanes`` (e.g. 2 ranks x 132 programs) each rank becomes one panel that
    shows how many programs are in each colour group over time; pass ``programs=range(a, b)`` to zoom back
    to individual lanes. Per-rank summary figures go in the lower panel. In a notebook the chart is shown
    under the cell (``show=False``: not; :func:`shown`).
    """
    import matplotlib.pyplot as plt

    df = trace.iteration(iteration)
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
        _draw_aggregate(ax, df, span)
    else:
        _draw_lanes(ax, df, lanes, span, width, trace.meta["num_sms"] if trace.meta.get("comm_sms") else None)
    m = trace.meta
    it = sorted(trace.events["iteration"].unique())[iteration] if len(trace.events) else 0
    races = 0 if aggregate else _draw_races(ax, trace, df, lanes, it, scale, span)
    ax.set_title(_title(m, len(df), it), fontsize=10)
    ax.set_xlabel(f"time since the iteration started ({unit})")
    summary = trace.summary(iteration)   # the table below, and the launch skew drawn in the lanes
    skewed = not aggregate and _draw_launch_skew(ax, summary["launch_skew_us"] / scale, lanes, span)
    _legend(ax, trace, df, skewed, races)
    _draw_summary(summary, ax_sum, ranks, scale, unit)
    return finish_figure(fig, path, show)


def _title(m, events, iteration):
    """The chart's title from the trace's meta ``m``."""
    if m.get("source") == "iris":   # a program's own events: no GEMM shape to name
        return f"{m['algorithm']}: {plural(m.get('world_size'), 'rank')} x {m.get('num_sms')} programs, {events} events"
    comm = f" + {m['comm_sms']} communication" if m.get("comm_sms") else ""
    W = m.get("world_size") or 1
    k_rank = _k_per_rank(m["k"], W) if W > 1 and isinstance(m.get("k"), int) else "one rank"
    return (f"{m.get('algorithm')} all-reduce, M x N x K = {m.get('m')} x {m.get('n')} x {m.get('k')} "
            f"{m.get('datatype')} (K split over the ranks: {k_rank}), blocks "
            f"{m.get('BLK_M')}x{m.get('BLK_N')}x{m.get('BLK_K')}\n{plural(m.get('world_size'), 'rank')} x "
            f"{m.get('num_sms')}{comm} {'program' if m.get('num_sms') == 1 and not comm else 'programs'}, "
            f"{m.get('backend')} backend, iteration {iteration}")


def _legend(ax, trace, df, skewed, races):
    """Only the groups this chart shows, named for this algorithm, outside the data; the launch skew's
    hatching and the races' lines where drawn."""
    import matplotlib.pyplot as plt

    labels = phase_labels(trace.protocol)
    shown = [p for p in GROUP_COLORS if (df["group"] == p).any()]
    handles = [plt.Rectangle((0, 0), 1, 1, color=GROUP_COLORS[p]) for p in shown]
    names = [labels[p] for p in shown]
    if skewed:
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="#eeeeee", hatch="///", edgecolor="#999999"))
        names.append("not launched yet (launch skew)")
    if races:
        from matplotlib.lines import Line2D

        handles.append(Line2D([0], [0], color=RACE_COLOR, ls="--", marker="x"))
        names.append(f"race: two accesses nothing orders\n({plural(len(trace.meta['races']), 'race')}: "
                     f"result.sanitizer)")
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, framealpha=0.9)


def _k_per_rank(k, W):
    """How K is split: "13 per rank", or "13 or 12 per rank" when W does not divide it (k_bounds)."""
    low, extra = divmod(k, W)
    return f"{low} per rank" if not extra else f"{low + 1} or {low} per rank"


def _draw_launch_skew(ax, skew, lanes, span):
    """Hatched grey from the first rank's first event to each later rank's first (``skew``: the summary's,
    over all of the rank's programs, in the chart's unit): that rank's kernel had not started yet, which is
    not the protocol making it wait. True if any was drawn."""
    late = skew[skew > span * 0.01]
    for i, (rank, _) in enumerate(lanes):
        if rank in late.index:
            ax.barh(i, late[rank], left=0, height=0.8, facecolor="#eeeeee", hatch="///", edgecolor="#999999",
                    linewidth=0)
    return not late.empty


RACE_COLOR = "#d62728"


def _draw_races(ax, trace, df, lanes, iteration, scale, span, most=24):
    """The sanitizer's races (``trace.meta["races"]``, sanitize=True) that fall in this iteration: both accesses
    as crosses, joined by a dashed line, each on the lane of the program that was running on its rank then
    (the interpreter runs one program of a rank at a time). Returns how many pairs it drew."""
    events = trace.events
    raw = events.loc[events["iteration"] == iteration, "start_us"]
    if not trace.meta.get("races") or raw.empty:
        return 0
    t0 = raw.min()
    index = {lane: i for i, lane in enumerate(lanes)}

    def place(side):
        x = (side["time_ns"] / 1e3 - t0) / scale
        rows = df[df["rank"] == side["rank"]]
        if rows.empty or not 0 <= x <= span * 1.01:
            return None
        gap = np.maximum(rows["start_us"].to_numpy() - x, 0) + np.maximum(x - rows["end_us"].to_numpy(), 0)
        row = rows.iloc[int(np.argmin(gap))]
        return x, index[(row["rank"], row["program"])]

    drawn = 0
    for number, race in enumerate(trace.meta["races"], 1):
        labelled = False
        for pair in race["sides"]:
            points = [place(side) for side in pair]
            if None in points or drawn >= most:
                continue
            (xa, ya), (xb, yb) = points
            ax.plot([xa, xb], [ya, yb], color=RACE_COLOR, ls="--", lw=1.0, zorder=5)
            ax.scatter([xa, xb], [ya, yb], color=RACE_COLOR, marker="x", s=40, zorder=6)
            if not labelled:   # each race's number once, at the later access of its first pair drawn
                ax.annotate(f"race {number}", (xb, yb), xytext=(5, 5), textcoords="offset points", fontsize=7,
                            color=RACE_COLOR, zorder=6, bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
                labelled = True
            drawn += 1
    return drawn


def _draw_lanes(ax, df, lanes, span, width_in, gemm_programs=None, max_labels=600):
    """Every event as one rectangle of a single PolyCollection (one artist for all, so that 400k events draw
    in seconds), tile ids on the GEMM bars wide enough to hold one (at most ``max_labels``)."""
    from matplotlib.collections import PolyCollection

    keys = np.array([r * (1 << 20) + p for r, p in lanes])             # lanes are sorted, so keys are too
    y = np.searchsorted(keys, df["rank"].to_numpy() * (1 << 20) + df["program"].to_numpy())
    start = df["start_us"].to_numpy(float)
    end = start + np.maximum(df["duration_us"].to_numpy(float), span * 1e-4)
    corners = np.stack([np.stack([start, y - 0.4], 1), np.stack([start, y + 0.4], 1),
                        np.stack([end, y + 0.4], 1), np.stack([end, y - 0.4], 1)], 1)
    colors = df["group"].map(GROUP_COLORS).fillna("#999999").to_numpy()
    ax.add_collection(PolyCollection(corners, facecolors=colors, edgecolors="none"))
    px_per_us = width_in * 80 / max(span, 1e-9)
    tiles = df["tile"].to_numpy()
    # A 7-point digit is about 5 pixels wide at 80 dpi, a 5.5-point one 4: a bar holds its id in the larger size
    # with 2 pixels to spare each side, or else in the smaller with 1.
    digits = np.char.str_len(tiles.astype(str))
    px = df["duration_us"].to_numpy() * px_per_us
    fits = np.flatnonzero((df["group"].to_numpy() == "gemm") & (px > digits * 4 + 2))
    for i in fits[:max_labels]:
        ax.text((start[i] + end[i]) / 2, y[i], str(tiles[i]), ha="center", va="center", color="white",
                fontsize=7 if px[i] > digits[i] * 5 + 4 else 5.5)
    ax.set_yticks(range(len(lanes)))
    # Communication programs come after the GEMM's (two_shot): labelled as what they are.
    ax.set_yticklabels([f"rank {r} · comm {p - gemm_programs}" if gemm_programs is not None and p >= gemm_programs
                        else f"rank {r} · prog {p}" for r, p in lanes], fontsize=7)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    for i in range(1, len(lanes)):
        if lanes[i][0] != lanes[i - 1][0]:
            ax.axhline(i - 0.5, color="black", lw=0.8)
    ax.set_xlim(0, span * 1.01)


def _draw_aggregate(ax, df, span, bins=400):
    edges = np.linspace(0, span, bins + 1)
    mids = (edges[:-1] + edges[1:]) / 2
    ranks = sorted(df["rank"].unique())
    offset = 0.0
    yticks, ylabels = [], []
    for rank in ranks[::-1]:
        d = df[df["rank"] == rank]
        n_prog = d["program"].nunique()
        bottom = np.zeros(bins)
        for group, color in GROUP_COLORS.items():
            p = d[d["group"] == group]
            # Programs in this group at each bin's middle: events begun by then, less those ended by then.
            count = (np.searchsorted(np.sort(p["start_us"].to_numpy()), mids, side="right") -
                     np.searchsorted(np.sort(p["end_us"].to_numpy()), mids, side="right")).astype(float)
            ax.fill_between(mids, offset + bottom / n_prog, offset + (bottom + count) / n_prog, color=color,
                            step="mid", lw=0)
            bottom += count
        # One program busy on its own is a hairline in a share: mark where the rank's last GEMM tile and its
        # launch end, so a long tail shows.
        gemm_end, launch_end = d.loc[d["group"] == "gemm", "end_us"].max(), d["end_us"].max()
        # (One label above the band, one below: the two lines are often close.)
        for x, style, what, y, va in ((gemm_end, ":", "last GEMM tile ends", offset - 0.06, "top"),
                                      (launch_end, "-", "launch ends", offset + 1.06, "bottom")):
            if np.isfinite(x):
                ax.plot([x, x], [offset - 0.05, offset + 1.05], color="black", ls=style, lw=1)
                ax.text(x, y, f" {what}", fontsize=6.5, va=va, ha="right" if x > 0.85 * span else "left")
        yticks += [offset, offset + 0.5, offset + 1.0]
        ylabels += ["0 %", f"rank {rank}: 50 %\n({n_prog} programs)", "100 %"]
        offset += 1.15
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.set_ylabel("share of the rank's programs in each group")
    ax.set_xlim(0, span)


def _draw_summary(s, ax, ranks, scale, unit):
    if ranks is not None:
        s = s.loc[[r for r in s.index if r in set(ranks)]]
    ax.axis("off")
    header = ["rank"] + [f"{name} ({unit})" for name in ("launch skew", "span", "GEMM", "waiting", "comm",
                                                          "reduce")] + ["hidden"]
    cells = [[str(r)] + [f"{x / scale:.1f}" for x in (v.launch_skew_us, v.span_us, v.gemm_us, v.wait_us, v.comm_us,
                                                      v.reduce_us)]
             + ["-" if np.isnan(v.hidden_share) else f"{100 * v.hidden_share:.0f} %"] for r, v in s.iterrows()]
    table = ax.table(cellText=cells, colLabels=header, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.1)
    ax.set_title("per rank: times summed over programs; hidden = share of the rank's communication wall "
                 "time during which one of its programs was in a GEMM", fontsize=9)


@drawn_as_written
def tile_grid(trace, iteration=-1, path=None, show=True):
    """Heat maps per rank: which program did which tile, and when each tile's result was stored (shown under
    the cell in a notebook unless ``show=False``)."""
    import matplotlib.pyplot as plt

    df = trace.iteration(iteration)
    m = trace.meta
    tm, tn = trace.tiles
    trace.check_grid_drawable()
    ranks = sorted(df["rank"].unique())   # (the ranks that have events: a 64-rank trace may hold two)
    if len(ranks) * tm * tn > MAX_GRID_CELLS:   # (two float arrays per rank, before any is made)
        raise UsageError(f"the tile grid of {len(ranks)} ranks x {tm} x {tn} tiles is too large to draw: at most "
                         f"{MAX_GRID_CELLS} rank-tiles in all (fewer ranks, or a smaller C)")
    scale, unit = time_unit(df["end_us"].max())
    columns = min(len(ranks), GRID_COLUMNS)
    blocks = -(-len(ranks) // columns)
    fig, grid = plt.subplots(2 * blocks, columns, figsize=(3.2 * columns + 1, 6.2 * blocks), squeeze=False)
    for ax in grid[-2:, len(ranks) % columns or columns:].flat:
        ax.set_visible(False)   # (the last row of ranks, where it is not full)
    programs_total = m["num_sms"] + (m.get("comm_sms") or 0)
    cmap, norm = program_colormap(programs_total)
    for number, rank in enumerate(ranks):
        axes, c = grid[2 * (number // columns):2 * (number // columns) + 2, :], number % columns
        d = df[df["rank"] == rank]
        program = np.full((tm, tn), np.nan)
        finish = np.full((tm, tn), np.nan)
        work = d[d["kind"] == "gemm"] if (d["kind"] == "gemm").any() else d   # (Iris: any event of the tile)
        for _, e in work[work["tile"] >= 0].iterrows():
            program[e["pid_m"], e["pid_n"]] = e["program"]
        # The spec's done rule: an owner that writes every rank's C marks the tile on all ranks; "peer": the
        # pushes into this rank's copy (by every rank).
        # No done rule (an Iris trace): the end of each tile's last event on this rank.
        rule = trace.protocol["done"] or {"where": "rank", "kind": None}
        done = {"rank": d, "every_rank": df, "peer": df[df["peer"] == rank]}[rule["where"]]
        done = done[((done["kind"] == rule["kind"]) | (rule["kind"] is None)) & (done["tile"] >= 0)]
        for _, e in done.iterrows():
            cur = finish[e["pid_m"], e["pid_n"]]
            finish[e["pid_m"], e["pid_n"]] = e["end_us"] if np.isnan(cur) else max(cur, e["end_us"])
        im0 = axes[0, c].imshow(program, cmap=cmap, norm=norm)
        axes[0, c].set_title(f"rank {rank}: program per tile", fontsize=9)
        im1 = axes[1, c].imshow(finish / scale, cmap="viridis")
        axes[1, c].set_title(f"rank {rank}: tile {'reduced' if trace.protocol['done'] else 'last event'} at "
                             f"({unit})", fontsize=9)
        if tm * tn <= 64:
            for i in range(tm):
                for j in range(tn):
                    if not np.isnan(program[i, j]):
                        axes[0, c].text(j, i, int(program[i, j]), ha="center", va="center", fontsize=7)
        fig.colorbar(im1, ax=axes[1, c], fraction=0.046)
        for ax in axes[:, c]:
            ax.set_xlabel("pid_n")
            ax.set_ylabel("pid_m")
    program_colorbar(fig, im0, im0.axes, programs_total, label="program")
    grouping = f"GROUP_SIZE_M={m['gsize_m']}, " if m.get("gsize_m") else ""   # (an Iris trace has none)
    fig.suptitle(f"{m['algorithm']}: tile schedule ({grouping}{m['num_sms']} programs)")
    return finish_figure(fig, path, show)


def ring_handoff_diagram(world_size=3, path=None):
    """One tile through the ring, drawn: each rank's slot and flags for the tile, and at every step the
    payload each rank stores into the next rank's slot (then ``data_ready`` there), and the ``slot_free``
    it hands back to the previous rank once it has read its own slot."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    W = world_size
    angles = [np.pi / 2 - 2 * np.pi * r / W for r in range(W)]
    centre = {r: (2.2 * np.cos(a), 2.2 * np.sin(a)) for r, a in enumerate(angles)}
    fig, ax = plt.subplots(figsize=(7.5, 7))
    for r, (x, y) in centre.items():
        ax.add_patch(FancyBboxPatch((x - 1.0, y - 0.55), 2.0, 1.1, boxstyle="round,pad=0.05", facecolor="#f4f4f4",
                                    edgecolor="black"))
        ax.text(x, y + 0.3, f"rank {r}", ha="center", fontsize=11, weight="bold")
        ax.text(x, y - 0.05, "partial of tile t (GEMM)", ha="center", fontsize=8, color=GROUP_COLORS["gemm"])
        ax.text(x, y - 0.35, "slot[t]  data_ready[t]  slot_free[t]", ha="center", fontsize=7)
    for r in range(W):
        nxt = (r + 1) % W
        (x0, y0), (x1, y1) = centre[r], centre[nxt]
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=16, lw=2,
                                     color=GROUP_COLORS["comm"], shrinkA=45, shrinkB=45,
                                     connectionstyle="arc3,rad=0.18"))
        # The caption goes outside the dashed hand-back arc, on the side facing away from the ring's centre, so
        # that its width grows away from the arrows (centred there, it lay across the dashed arc).
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        out = np.hypot(mx, my)
        if out < 1e-6:   # two ranks: the chord crosses the centre; go the way the green arc bends
            mx, my, out = 0.18 * (y1 - y0), 0.18 * (x0 - x1), 0.0
        ux, uy = np.array([mx, my]) / np.hypot(mx, my)
        reach = max(out + 1.05, 1.9)
        ha = "center" if abs(ux) < 0.3 else ("left" if ux > 0 else "right")
        cx = ux * reach - (0.5 * ux if ha != "center" else 0.0)
        ax.text(cx, uy * reach, f"rank {r} stores its payload into rank {nxt}'s slot[t],\nthen data_ready[t] += 1 "
                f"there (release)", ha=ha, va="center", fontsize=7.5, color=GROUP_COLORS["comm"],
                bbox=dict(facecolor="white", edgecolor="none", pad=1))
        # (With two ranks both arcs join the same pair of boxes: the dashed one bends further, to be seen.)
        ax.add_patch(FancyArrowPatch((x1, y1), (x0, y0), arrowstyle="-|>", mutation_scale=12, lw=1.2, ls="--",
                                     color=GROUP_COLORS["wait"], shrinkA=45, shrinkB=45,
                                     connectionstyle=f"arc3,rad={0.18 if W > 2 else -0.3}"))
    # The key, in a corner away from the arrows (in the centre it sat on the rank 0 -> 1 arrow).
    ax.text(-3.5, -3.0, f"{W} ranks: {W - 1} step{'s' if W != 2 else ''} per tile. At step 0 the payload is the "
                        f"rank's own partial.\ngreen: a message, and its flag; orange, dashed: slot_free[t] handed back\n"
                        f"once the slot was read (after the acquire of data_ready[t])", ha="left", va="top", fontsize=8)
    ax.set_xlim(-3.6, 3.6)
    ax.set_ylim(-3.9, 3.4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("The ring's lock handoff for one tile (kernels/ring.py, steps 1-4)")
    return finish_figure(fig, path)
