"""Step through a saved trace event by event: the state of every rank's tiles, the ring's flags, who waits.

The state at time t is computed from the events alone (no cluster needed):

- a tile on rank r is *in GEMM* between its gemm event's start and end, *partial* from then until it is
  reduced, and *reduced* once rank r holds the full sum, by the algorithm's done rule (its spec's
  ``done``): for the ring, when r's final store of the tile ends; for atomics, when the last of the
  world_size pushes into r's copy of the tile ends; for two_shot, when the owner's broadcast ends;
- flags the spec names (``flags``: the ring's data_ready and slot_free), counted within the iteration:
  ``flags[name][r][tile]`` = how many of the events that raise it have reached rank r (their peer);
- a program is *waiting* while one of its wait events is open, and the line says what for (the phase's
  ``waits_for``).
"""

import re
import numpy as np

STATE_NAMES = ("not started", "in GEMM", "partial", "reduced")
STATE_COLORS = ("#eeeeee", "#4C72B0", "#DD8452", "#55A868")


class _Timeline:
    """Per-(rank, tile) times and flag events of one iteration, as arrays, for fast queries by time."""

    def __init__(self, trace, iteration):
        df = trace.iteration(iteration)
        m = trace.meta
        self.meta, self.df = m, df
        self.W = int(m["world_size"])
        self.tm, self.tn = trace.tiles
        trace.check_grid_drawable()   # (the arrays below are ranks x tiles)
        tiles = self.tm * self.tn
        inf = np.inf
        self.gemm_start = np.full((self.W, tiles), inf)
        self.gemm_end = np.full((self.W, tiles), inf)
        self.done = np.full((self.W, tiles), inf)
        self.coords = {}
        protocol = trace.protocol
        for e in df.itertuples():
            if e.tile >= 0:   # (a whole-launch event, like two_shot's result_wait, is about no one tile)
                self.coords[e.tile] = (e.pid_m, e.pid_n)
        # A tile's GEMM, from its first start to its last end (a split-K tile has a gemm event per K slice).
        spans = df[df["kind"] == "gemm"].groupby(["rank", "tile"]).agg(start=("start_us", "min"), end=("end_us", "max"))
        for (rank, tile), start, end in spans.itertuples(name=None):
            self.gemm_start[rank, tile], self.gemm_end[rank, tile] = start, end
        done = protocol["done"] or {"kind": None, "where": "rank"}   # (an Iris trace has no done rule)
        finals = df[(df["kind"] == done["kind"]) & (df["tile"] >= 0)]
        if done["where"] == "rank":
            for e in finals.itertuples():
                self.done[e.rank, e.tile] = min(self.done[e.rank, e.tile], e.end_us)
        elif done["where"] == "every_rank":   # an owner writes every rank's C
            for e in finals.itertuples():
                self.done[:, e.tile] = np.minimum(self.done[:, e.tile], e.end_us)
        else:   # "peer": once every rank's event for that peer and tile has ended
            for (peer, tile), p in finals.groupby(["peer", "tile"]):
                if p["rank"].nunique() == self.W:
                    self.done[peer, tile] = p["end_us"].max()
        self.flags = {flag: df[df["kind"] == kind][["peer", "tile", "end_us"]].to_numpy()
                      for flag, kind in protocol.get("flags", {}).items()}
        self.waits_for = {p["name"]: p.get("waits_for", "") for p in protocol["phases"]}
        self.waits = df[df["group"] == "wait"]
        self.times = np.unique(np.concatenate([df["start_us"].to_numpy(), df["end_us"].to_numpy()]))
        self.race_marks = self._race_marks(trace, iteration)

    def _race_marks(self, trace, iteration):
        """(time in this iteration, "race n: rank r writes partials[3, 0] at two_shot.py:168"): the sanitizer's
        race accesses (sanitize=True) that fall in this iteration, in time order."""
        races = trace.meta.get("races") or []
        its = sorted(trace.events["iteration"].unique())
        if not races or not its or self.times.size == 0:
            return []
        t0 = trace.events.loc[trace.events["iteration"] == its[iteration], "start_us"].min()
        marks = [(side["time_ns"] / 1e3 - t0, f"race {n}: rank {side['rank']} {side['doing']}")
                 for n, race in enumerate(races, 1) for pair in race["sides"] for side in pair]
        return sorted((t, text) for t, text in set(marks) if 0 <= t <= self.times[-1])

    def _grid(self, values):
        grid = np.zeros((self.tm, self.tn), dtype=values.dtype)
        for tile, (pm, pn) in self.coords.items():
            grid[pm, pn] = values[tile]
        return grid

    def _counts(self, rows, t):
        counts = np.zeros((self.W, self.tm * self.tn), dtype=np.int64)
        for peer, tile, end in rows:
            if end <= t:
                counts[int(peer), int(tile)] += 1
        return counts

    def state_at(self, step):
        t = self.times[step]
        status = np.zeros((self.W, self.tm * self.tn), dtype=np.int64)
        status[self.gemm_start <= t] = 1
        status[self.gemm_end <= t] = 2
        status[self.done <= t] = 3
        w = self.waits
        open_waits = w[(w["start_us"] <= t) & (w["end_us"] > t)]
        waiting = []
        for e in open_waits.itertuples():
            waiting.append(f"rank {e.rank} program {e.program}: {wait_explanation(e, self.W, self.waits_for)}")
        d = self.df
        happened = d[(d["end_us"] == t) | (d["start_us"] == t)]
        event = "; ".join(f"rank {e.rank} prog {e.program}: {e.kind} tile {e.tile} "
                          f"{'ends' if e.end_us == t else 'starts'}" for e in happened.head(4).itertuples())
        state = dict(step=step, time_us=float(t), event=event, waiting=waiting,
                     tiles=[self._grid(status[r]) for r in range(self.W)])
        state["flags"] = {flag: self._counts(rows, t) for flag, rows in self.flags.items()}
        before = self.times[step - 1] if step > 0 else -np.inf
        state["races"] = [text for when, text in self.race_marks if before < when <= t]
        return state


def wait_explanation(e, world_size, waits_for):
    """What a wait event (a row of the trace) waits for, in words: its phase's ``waits_for`` text (from the
    algorithm's spec) filled in with the event's fields."""
    text = waits_for.get(e.kind, "")
    if not text:
        return f"tile {e.tile}: {e.kind}"
    fields = dict(tile=e.tile, step=e.step, peer=e.peer, pid_m=e.pid_m, pid_n=e.pid_n, rank=e.rank,
                  world_size=world_size)
    # Only bare {name} fields are filled in: the text comes from a file, and str.format would evaluate
    # attribute and index look-ups and format specs (a {tile:>900000000} field asks for 900 MB of spaces).
    return re.sub(r"\{(\w+)\}", lambda found: str(fields[found[1]]) if found[1] in fields else found[0], text)


def build_states(trace, iteration=-1):
    timeline = _Timeline(trace, iteration)
    return [timeline.state_at(i) for i in range(len(timeline.times))]


class ReplayWidget:
    """Slider + play button; each step redraws every rank's tile grid and lists who waits on what."""

    def __init__(self, trace, iteration=-1):
        import ipywidgets as widgets

        self.timeline = _Timeline(trace, iteration)
        n = len(self.timeline.times)
        self.span_us = float(max(self.timeline.times)) if n else 0.0
        self.slider = widgets.IntSlider(value=0, min=0, max=max(n - 1, 0), description="step",
                                        continuous_update=False, layout=widgets.Layout(width="60%"))
        self.play = widgets.Play(value=0, min=0, max=max(n - 1, 0), interval=300, description="play")
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.out = widgets.Output()
        # The picture first and the words under it, in a box that keeps its height: the words' line count
        # changes from step to step, and above the picture they made it jump up and down while playing.
        self.text = widgets.HTML(layout=widgets.Layout(min_height="9em"))
        self.slider.observe(lambda change: self.draw(change["new"]), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.play, self.slider]), self.out, self.text])
        self.draw(0)

    def draw(self, step):
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        from .figures import display_png, plain_text, time_unit

        state = self.timeline.state_at(step)
        W = self.timeline.W
        self.out.clear_output(wait=True)
        with self.out, plain_text():
            fig, axes = plt.subplots(1, W, figsize=(2.6 * W + 0.5, 2.8), squeeze=False)
            for r in range(W):
                ax = axes[0, r]
                ax.imshow(state["tiles"][r], cmap=ListedColormap(STATE_COLORS), vmin=0, vmax=3)
                ax.set_title(f"rank {r}", fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
                if self.timeline.tm * self.timeline.tn <= 36:
                    for tile, (pm, pn) in self.timeline.coords.items():
                        counts = "/".join(str(c[r, tile]) for c in state["flags"].values())
                        ax.text(pn, pm, f"tile {tile}" + (f"\n{counts}" if counts else ""), ha="center",
                                va="center", fontsize=7)
            handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STATE_COLORS]
            fig.legend(handles, STATE_NAMES, loc="lower center", ncol=4, fontsize=8)
            fig.tight_layout(rect=(0, 0.12, 1, 1))
            display_png(fig)   # (a PNG: a Figure displays as text where no inline backend registered it)
            plt.close(fig)
        flags = f" (under each tile id: its {'/'.join(state['flags'])} counters)" if state["flags"] else ""
        waits = "<br>".join(state["waiting"]) or "nobody is waiting"
        scale, unit = time_unit(self.span_us)
        races = "".join(f"<br><span style='color:#d62728'>{text}</span>" for text in state["races"][:6])
        self.text.value = (f"<b>t = {state['time_us'] / scale:.1f} {unit}</b>{flags}<br>{state['event']}<br>"
                           f"<i>{waits}</i>{races}")
