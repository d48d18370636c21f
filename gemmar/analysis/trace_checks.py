"""What a gemmar trace file must hold, checked whole on load (``Trace.load``): a file is data, so every part
the figures and the replay read is checked for the type and range they read, and a bad one is one line."""

import numpy as np

from ..errors import UsageError
from ..kernels.events import COLUMNS

RAW_COLUMNS = list(COLUMNS)


def protocol(meta):
    """The algorithm's protocol (phases, done rule, flags, labels) a trace's meta carries; for traces written
    before it carried one (the files in data/), the built-in algorithm's."""
    if isinstance(meta.get("protocol"), dict):
        return meta["protocol"]
    from ..algorithms import get

    return get(meta.get("algorithm")).describe()


DONE_WHERE = ("rank", "every_rank", "peer")   # the done rules replay.py and plots.tile_grid know


def check_protocol(proto):
    """A protocol from a file is data: every part the figures and the replay read has the type they read
    (TypeError naming the first that has not)."""
    if not isinstance(proto, dict) or not isinstance(proto.get("phases"), list) or not proto["phases"]:
        raise TypeError("no list of phases")
    names = set()
    for phase in proto["phases"]:
        if not isinstance(phase, dict) or not {"kind_id", "name", "group"} <= set(phase):
            raise TypeError("a phase without kind_id, name or group")
        if isinstance(phase["kind_id"], bool) or not isinstance(phase["kind_id"], int) or \
                not all(isinstance(phase.get(key, ""), str) for key in ("name", "group", "waits_for")):
            raise TypeError(f"phase {str(phase)[:60]}: kind_id must be a number, name, group and waits_for text")
        names.add(phase["name"])
    done = proto.get("done")
    if done is not None and (not isinstance(done, dict) or done.get("kind") not in names
                             or done.get("where") not in DONE_WHERE):
        raise TypeError(f"done rule {str(done)[:50]}: its kind must be a phase, its where one of "
                        f"{', '.join(DONE_WHERE)}")
    for part in ("flags", "labels"):
        value = proto.get(part, {})
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise TypeError(f"its {part} are not names mapped to text")


def checked_meta(meta):
    """The run description a trace file carries, checked as the run's own settings were (a bad one would
    crash a figure later, after the PNG was half written)."""
    from ..config import RunConfig

    if not isinstance(meta, dict):
        raise UsageError(f"its meta is {type(meta).__name__}, not a dict of run settings")
    names = ("algorithm", "m", "n", "k", "datatype", "BLK_M", "BLK_N", "BLK_K", "gsize_m", "num_sms", "world_size",
             "iterations")
    missing = [name for name in names if name not in meta]
    if missing:
        raise UsageError(f"its meta lacks {', '.join(missing)}")
    try:
        check_protocol(protocol(meta))
    except (UsageError, KeyError, TypeError) as e:
        raise UsageError(f"its meta names algorithm {str(meta.get('algorithm'))[:40]!r} and carries no readable "
                         f"protocol ({str(e)[:160]})") from None
    comm = meta.get("comm_sms") or 0
    if isinstance(comm, bool) or not isinstance(comm, int) or not 0 <= comm <= 4096:
        raise UsageError(f"its meta's comm_sms is {comm!r}, not a number of programs")
    # The sizes, checked as a run's are (the algorithm, maybe a user's, need not be registered here).
    RunConfig(**{name: meta[name] for name in names if name != "algorithm"}).validate()
    return meta


def check_events(trace):
    """Every event names a rank, program and kind the run had, and ends no earlier than it starts."""
    m, ev = trace.meta, trace.raw
    if not len(ev):
        return
    programs = m["num_sms"] + (m.get("comm_sms") or 0)
    columns = {name: ev[:, i] for i, name in enumerate(RAW_COLUMNS)}
    tiles_m, tiles_n = -(-m["m"] // m["BLK_M"]), -(-m["n"] // m["BLK_N"])
    phases = protocol(m)["phases"]
    kinds = [p["kind_id"] for p in phases]
    # A phase about no one tile (two_shot's wait for an owner's tiles) has tile, pid_m and pid_n -1.
    whole = np.isin(columns["kind_id"], [p["kind_id"] for p in phases if p.get("whole_launch")])
    least = np.where(whole, -1, 0)
    problems = [(columns["rank"] < 0) | (columns["rank"] >= m["world_size"]), "a rank outside the world size",
                (columns["program"] < 0) | (columns["program"] >= programs), "a program outside the launch",
                ~np.isin(columns["kind_id"], kinds), f"an event kind that {m['algorithm']} does not record",
                (columns["tile"] < least) | (columns["tile"] >= tiles_m * tiles_n), "a tile outside the grid",
                (columns["pid_m"] < least) | (columns["pid_m"] >= tiles_m) | (columns["pid_n"] < least) |
                (columns["pid_n"] >= tiles_n), "tile coordinates outside the grid",
                columns["t_end_ns"] < columns["t_start_ns"], "an end before its start"]
    for bad, what in zip(problems[::2], problems[1::2]):
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise UsageError(f"event {row} has {what} ({dict(zip(RAW_COLUMNS, ev[row].tolist()))})")
