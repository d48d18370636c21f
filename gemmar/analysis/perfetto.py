"""A Trace as Chrome/Perfetto trace JSON: one process per rank, one thread per program."""

import json

import numpy as np


def to_perfetto(trace, path=None):
    """Chrome/Perfetto trace JSON: one process per rank, one thread per program, one complete event per
    phase with tile ids in args. Open it at ui.perfetto.dev. Returns the dict (and writes ``path``)."""
    events = []
    for rank in sorted(trace.events["rank"].unique()):
        events.append(dict(ph="M", name="process_name", pid=int(rank), tid=0, args=dict(name=f"rank {rank}")))
        for program in sorted(trace.events.loc[trace.events["rank"] == rank, "program"].unique()):
            events.append(dict(ph="M", name="thread_name", pid=int(rank), tid=int(program),
                               args=dict(name=f"program {program}")))
    for e in trace.events.itertuples():
        events.append(dict(ph="X", name=f"{e.kind} t{e.tile}", cat=e.group, pid=int(e.rank), tid=int(e.program),
                           ts=float(e.start_us), dur=float(max(e.duration_us, 0.0)),
                           args=dict(tile=int(e.tile), pid_m=int(e.pid_m), pid_n=int(e.pid_n), step=int(e.step),
                                     peer=int(e.peer), iteration=int(e.iteration))))
    events += race_flows(trace)
    doc = dict(traceEvents=events, displayTimeUnit="ns", metadata=dict(trace.meta, format=trace.FORMAT))
    if path:
        with open(path, "w") as f:
            json.dump(doc, f)
    return doc


def race_flows(trace):
    """The sanitizer's races (sanitize=True) as Perfetto flows: an instant event at each access, on the thread of
    the program running on its rank then, and a flow arrow from the earlier to the later, named by the race."""
    out, flow = [], 0
    ev = trace.events
    for number, race in enumerate(trace.meta.get("races") or [], 1):
        for pair in race["sides"]:
            flow += 1
            for side, phase in zip(pair, ("s", "f")):
                rows = ev[ev["rank"] == side["rank"]]
                if rows.empty:
                    continue
                t = side["time_ns"] / 1e3
                gap = np.maximum(rows["start_us"].to_numpy() - t, 0) + np.maximum(t - rows["end_us"].to_numpy(), 0)
                program = int(rows["program"].iloc[int(np.argmin(gap))])
                where = dict(pid=int(side["rank"]), tid=program, ts=float(t))
                out.append(dict(ph="i", s="t", name=f"race {number}", cat="race", args=dict(access=side["doing"],
                                                                                          race=race["text"]), **where))
                out.append(dict(ph=phase, id=flow, name=f"race {number}", cat="race", bp="e", **where))
    return out
