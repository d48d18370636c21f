"""Iris's device trace files, written and read: what ``shmem.tracing.export()`` writes on gemmar's ranks, and
what ``Trace.load`` makes of such a file (:func:`read`) (one written by Iris on AMD GPUs too) so that ``gemmar gantt`` draws
it like gemmar's own per-tile traces.

The file is Chrome/Perfetto trace JSON (open it at ui.perfetto.dev as it is): one process per rank, one
complete event (``"ph": "X"``) per recorded operation, or an instant (``"ph": "i"``) for one never ended, with
Iris's fields in ``args`` (``program_id``, ``pid_m``, ``pid_n``, ``target_rank``, ``op_index``, ``address``,
``payload_size``). gemmar writes ``ts``/``dur`` in µs, as the format defines them; Iris writes its GPU's raw
100 MHz cycles and says so in ``metadata.time_unit``, which the reader converts.
"""

import json
import os

import numpy as np

from ..config import MAX_DIM, MAX_WORLD_SIZE
from ..errors import UsageError
from ..kernels.events import COLUMNS

# Iris's event ids (its trace schema): name -> id. Ranges: 0 to 1023 Iris's own operations, 1024 to 2047 a
# program's data movement, 2048 to 3071 its compute, 3072 to 4095 synchronisation.
EVENT_IDS = {"load": 0, "store": 1, "get": 2, "put": 3, "copy": 4, "atomic_add": 5, "atomic_sub": 6,
             "atomic_cas": 7, "atomic_xchg": 8, "atomic_xor": 9, "atomic_and": 10, "atomic_or": 11,
             "atomic_min": 12, "atomic_max": 13, "fetch": 1024, "compute": 2048, "reduce": 2049, "wait": 3072,
             "barrier": 3073}
EVENT_NAMES = {event_id: name for name, event_id in EVENT_IDS.items()}

# One recorded event on the device: these int64 words, in this order (``DeviceTracing`` writes them).
RECORDED = ("event_id", "program", "pid_m", "pid_n", "target_rank", "op_index", "address", "payload_bytes",
            "t_start_ns", "t_end_ns")
EVENT_WORDS = len(RECORDED)
MAX_PROGRAMS = 1 << 20   # programs of one launch a trace may name

# The colour (gemmar's phase group) each kind of Iris event draws in.
LABELS = {"gemm": "computing (compute)", "comm": "moving data (load, store, get, put, copy, fetch)",
          "store": "atomics", "reduce": "reducing (reduce)", "wait": "waiting (wait, barrier)"}


def group(event_id):
    if event_id <= 4 or event_id == 1024:
        return "comm"
    if event_id <= 13:
        return "store"
    return {2048: "gemm", 2049: "reduce"}.get(event_id, "wait" if event_id >= 3072 else "comm")


def protocol(event_ids):
    """The phases an Iris trace draws in (gemmar's trace protocol), for the event ids it holds."""
    ids = sorted(set(EVENT_IDS.values()) | {int(i) for i in event_ids})
    return dict(phases=[dict(kind_id=i, name=EVENT_NAMES.get(i, f"event_{i}"), group=group(i)) for i in ids],
                done=None, flags={}, labels=LABELS)


def perfetto_events(rows, rank):
    """Chrome trace events of one rank's recorded rows (``RECORDED`` words each, times in ns)."""
    events = [dict(name="process_name", ph="M", pid=rank, tid=0, args=dict(name=f"rank {rank}"))]
    for row in rows:
        fields = dict(zip(RECORDED, (int(v) for v in row)))
        event = dict(name=EVENT_NAMES.get(fields["event_id"], f"event_{fields['event_id']}"), cat="iris",
                     ts=fields["t_start_ns"] / 1e3, pid=rank, tid=fields["program"],
                     args=dict(program_id=fields["program"], pid_m=fields["pid_m"], pid_n=fields["pid_n"],
                               target_rank=fields["target_rank"], op_index=fields["op_index"],
                               address=hex(fields["address"]), payload_size=fields["payload_bytes"],
                               event_id=fields["event_id"]))
        if fields["t_end_ns"] >= fields["t_start_ns"]:
            event.update(ph="X", dur=(fields["t_end_ns"] - fields["t_start_ns"]) / 1e3)
        else:   # started, never ended
            event.update(ph="i", s="t")
        events.append(event)
    return events


def document(events, **metadata):
    """The whole file: events and what they mean."""
    return dict(traceEvents=events, displayTimeUnit="ns",
                metadata=dict(schema="iris device trace, written by gemmar", time_unit="us", **metadata))


def merge(paths, path):
    """One file of several ranks' files, times shifted so the earliest event starts at 0 (the ranks of one
    machine share one clock on CPU; on GPUs each rank's clock is its own device's)."""
    events, metas = [], []
    for part in paths:
        with open(part) as f:
            doc = json.load(f)
        events += doc["traceEvents"]
        metas.append(doc.get("metadata", {}))
    first = min((e["ts"] for e in events if e.get("ph") != "M"), default=0.0)
    for e in events:
        if e.get("ph") != "M":
            e["ts"] -= first
    meta = dict(metas[0] if metas else {}, ranks=[m.get("rank") for m in metas], time_offset_us=first,
                dropped_events=[m.get("dropped_events", 0) for m in metas])
    meta.pop("rank", None)
    doc = dict(traceEvents=events, displayTimeUnit="ns", metadata=meta)
    with open(path, "w") as f:
        json.dump(doc, f)
    return doc


# What an event's fields may hold (a file is data: a rank of 2**40 would size arrays by it).
LIMITS = [("rank", 0, MAX_WORLD_SIZE - 1), ("iteration", 0, 0), ("program_id", 0, MAX_PROGRAMS - 1),
          ("event_id", 0, 1 << 20), ("pid_m", -1, MAX_DIM), ("pid_n", -1, MAX_DIM), ("op_index", 0, 1 << 62),
          ("target_rank", -1, MAX_WORLD_SIZE - 1), ("ts", 0, 1 << 62), ("ts + dur", 0, 1 << 62)]


def _check_event(row):
    for (field, least, most), value in zip(LIMITS, row):
        if not least <= value <= most:   # (NaN fails this too)
            raise ValueError(f"{field} {value!r} is not from {least} to {most}")
    if row[-1] < row[-2]:
        raise ValueError(f"dur {row[-1] - row[-2]!r} is negative")


def is_iris_trace(doc):
    """A Chrome trace whose events are Iris's (category "iris")."""
    return (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
            and any(isinstance(e, dict) and e.get("cat") == "iris" for e in doc["traceEvents"]))


def read(doc, path):
    """(events in gemmar's columns, meta) of an Iris trace document, for a ``Trace``: lanes are (rank,
    program), the kind is the event, the tile is ``pid_m * tiles_n + pid_n``, the step the operation's index
    and the peer its target rank."""
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    unit = str(meta.get("time_unit", "us"))
    to_ns = 10.0 if "cycles" in unit else 1e3   # Iris: cycles of a 100 MHz clock; gemmar: µs
    rows = []
    for number, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict) or e.get("cat") != "iris":
            continue
        try:
            args = e.get("args") or {}
            name = str(e["name"])
            event_id = int(args.get("event_id", EVENT_IDS.get(name, name.rpartition("_")[2])))
            start = float(e["ts"]) * to_ns
            end = start + float(e.get("dur", 0.0)) * to_ns
            row = [int(e["pid"]), 0, int(args.get("program_id", 0)), event_id, int(args.get("pid_m", 0)),
                   int(args.get("pid_n", 0)), int(args.get("op_index", number)),
                   int(args.get("target_rank", -1)), start, end]
            _check_event(row)
            rows.append(row[:8] + [int(round(start)), int(round(end))])
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise UsageError(f"{path}: Iris trace event {number} is not readable ({type(error).__name__}: "
                             f"{str(error)[:80]}): {str(e)[:120]}") from None
    if not rows:
        raise UsageError(f"{path} is an Iris trace with no events: was tracing enabled and the kernel launched "
                         f"with DeviceContext.initialize(..., tracing=True)?")
    table = np.array(rows, np.int64)
    # -> gemmar's columns: rank, iteration, program, kind_id, tile, pid_m, pid_n, step, peer, t_start, t_end
    pid_m, pid_n = table[:, 4], table[:, 5]
    tiles_m, tiles_n = int(max(pid_m.max(), 0)) + 1, int(max(pid_n.max(), 0)) + 1
    raw = np.empty((len(table), len(COLUMNS)), np.int64)
    raw[:, :4] = table[:, :4]
    raw[:, 4] = np.where((pid_m >= 0) & (pid_n >= 0), pid_m * tiles_n + pid_n, -1)
    raw[:, 5:] = table[:, 4:]
    raw[:, -2:] -= raw[:, -2].min()
    ranks = int(raw[:, 0].max()) + 1
    world_size = meta.get("world_size") or ranks
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not ranks <= world_size <= MAX_WORLD_SIZE:
        raise UsageError(f"{path}: its metadata's world_size is {repr(world_size)[:40]}: use a whole number from "
                         f"{ranks} (its events' ranks) to {MAX_WORLD_SIZE}")
    meta = dict(source="iris", algorithm=f"Iris trace of {os.path.basename(str(meta.get('process_name', path)))}",
                protocol=protocol(raw[:, 3]), m=tiles_m, n=tiles_n, k=None, BLK_M=1, BLK_N=1, BLK_K=None,
                datatype=None, num_sms=int(raw[:, 2].max()) + 1, comm_sms=0,
                world_size=world_size, iterations=1, backend=meta.get("backend", "?"),
                clock=unit, dropped_events=meta.get("dropped_events"))
    return raw, meta
