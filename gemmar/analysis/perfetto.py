"""A Trace as Chrome/Perfetto trace JSON: one process per rank, one thread per program."""

import json


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
        events.append(dict(ph="X", name=f"{e.kind} t{e.tile}", cat=e.phase, pid=int(e.rank), tid=int(e.program),
                           ts=float(e.start_us), dur=float(max(e.duration_us, 0.0)),
                           args=dict(tile=int(e.tile), pid_m=int(e.pid_m), pid_n=int(e.pid_n), step=int(e.step),
                                     peer=int(e.peer), iteration=int(e.iteration))))
    doc = dict(traceEvents=events, displayTimeUnit="ns", metadata=dict(trace.meta, format=trace.FORMAT))
    if path:
        with open(path, "w") as f:
            json.dump(doc, f)
    return doc
