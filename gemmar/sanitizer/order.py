"""Happens-before across ranks and programs, from the ranks' records (``record.py``), and the races it finds.

Every program of every kernel call is a thread with a vector clock. What orders two accesses:

- program order within a program;
- a kernel call starts after everything earlier on its stream and everything its host did before it; a
  stream that waits for another or for an event (``join``), an event recorded on a stream (``record``), and a
  host that waits for its streams, one stream or one event (``sync``), take their clocks. Two kernels on two
  streams with none of these between them run concurrently, as on a GPU, even where the cpu backend ran them
  one after the other;
- synchronises-with: an acquire (an atomic with ``sem="acquire"`` or ``"acq_rel"``) that reads a location
  takes the clock of the release that heads the location's release sequence, and of every release
  read-modify-write in it (a release store starts a sequence; read-modify-writes continue it; any other
  write ends it). The records are numbered in the order the memory saw them, so the value an acquire read is
  the last one written before it: no guess about which release it saw.

A host write to a heap (``zero_``, ``copy_``, ``heap.zeros``, Iris's ``shmem.zeros``) is an access of the rank's
host: after everything its host did before and after the earlier work of the stream it runs on (torch runs it
there on a GPU); before everything its host does after it, so before every later launch of the rank, and, through
a barrier, before what other ranks do after that barrier. It covers byte ranges: a location it covers that a kernel
touched before is checked at once; one touched later finds it in a map of the last host write over each range.

Two accesses to the same bytes from different programs, at least one a write, not both atomic, with neither
before the other, are a race: reported once per pair of lines and buffer, with what would order them.
(Polls are volatile loads: they count as relaxed atomic reads, which order nothing and race only with plain
writes.)
"""

import dataclasses

import numpy as np

from ..kernels.device import place
from .record import OWNER_SHIFT, element_text

ACQUIRES, RELEASES = ("acquire", "acq_rel"), ("release", "acq_rel")
DOING = {"read": "reads", "write": "writes", "rmw": "atomically updates"}
MAX_PAIRS = 64           # pairs of accesses kept per race, to draw
ACTING = {"read": "reading", "write": "writing", "rmw": "updating"}


@dataclasses.dataclass
class Access:
    """One recorded access, as the analysis keeps it."""

    seq: int
    rank: int
    call: int             # the rank's kernel call it belongs to
    program: int
    kernel: str
    thread: int
    clock: int
    kind: str
    atomic: bool
    sem: str
    where: tuple
    buffer: tuple
    owner: int
    keys: object
    time_ns: int          # CLOCK_MONOTONIC when it ran (the trace's clock on cpu ranks)
    op: str = None        # an atomic's operation (add, cas, xchg, ...)
    values: tuple = None  # an atomic's first lane: (the value it saw, the operand it gave)

    @property
    def line(self):
        return place(self.where)

    @property
    def on_host(self):
        return isinstance(self.thread, tuple)   # (the host's thread is ("host", rank); a program's, a number)

    def who(self):
        if self.on_host:
            return f"rank {self.rank} host ({self.op})"
        return f"rank {self.rank} program {self.program} ({self.kernel})"

    def doing(self):
        if self.kind == "read" and self.atomic:
            return "polls"
        if self.kind != "rmw":
            return DOING[self.kind]
        seen = f", saw {self.values[0]}" if self.values and self.values[0] is not None else ""
        return f"atomically updates ({self.op or 'rmw'}, {self.sem}{seen})"


@dataclasses.dataclass
class Race:
    first: Access         # the earlier of the two in the memory's order
    second: Access
    key: int              # the first location (owner rank << 40 | heap byte offset) they both touch
    locations: int = 1    # how many locations this pair of lines raced on
    hint: str = ""
    pairs: list = dataclasses.field(default_factory=list, repr=False)  # up to MAX_PAIRS (earlier, later), to draw
    seen: set = dataclasses.field(default_factory=set, repr=False)

    def sides(self, t_zero_ns=0):
        """Every drawn pair as two (rank, time in ns since ``t_zero_ns``, what it did) sides."""
        return [[dict(rank=x.rank, time_ns=int(x.time_ns - t_zero_ns), doing=f"{x.doing()} {self.element} at {x.line}")
                 for x in pair] for pair in self.pairs]

    @property
    def buffer(self):
        """The buffer both touch, as a kernel's access names it (a host write knows only where its first byte is)."""
        return self.second.buffer if self.first.on_host else self.first.buffer

    @property
    def element(self):
        offset = self.key & ((1 << OWNER_SHIFT) - 1)
        name, shape, dtype, start = self.buffer
        return element_text((name, shape, dtype), offset - start)

    @property
    def text(self):
        a, b = self.first, self.second
        more = f" (and {self.locations - 1} more locations of {self.buffer[0]})" if self.locations > 1 else ""
        return (f"race on {self.element} in rank {self.key >> OWNER_SHIFT}'s heap{more}: {a.who()} {a.doing()} it at "
                f"{a.line}, {b.who()} {b.doing()} it at {b.line}, and nothing orders the two. {self.hint}").strip()


@dataclasses.dataclass
class SanitizerReport:
    """What a sanitized run found: ``races`` (each with ``.text``), and how much it looked at."""

    races: list
    accesses: int
    ranks: int

    @property
    def ok(self):
        return not self.races

    def __str__(self):
        if self.ok:
            return (f"sanitizer: no race among {self.accesses} recorded heap accesses of {self.ranks} rank{'s' if self.ranks != 1 else ''} "
                    f"(and no access outside its buffer)")
        return "\n".join([f"sanitizer: {len(self.races)} race(s) among {self.accesses} heap accesses:"] +
                         [f"- {race.text}" for race in self.races])


def _join(into, other):
    for t, c in other.items():
        if into.get(t, 0) < c:
            into[t] = c


class _Order:
    def __init__(self):
        self.threads = {}      # (rank, kernel name, program) -> thread id
        self.clocks = {}       # thread id -> vector clock {thread id: count}
        self.instance = {}     # thread id -> the kernel call it last ran in
        self.host = {}         # rank -> clock
        self.streams = {}      # (rank, stream) -> clock
        self.meetings = {}     # a host collective (its ranks, its number among theirs) -> what its ranks did before
        self.events = {}       # (rank, event) -> the clock of the stream it was recorded on
        self.kernels = {}      # (rank, call) -> dict(name, stream, fork, threads)
        self.release = {}      # location -> clock of its release sequence
        self.shadow = {}       # location -> [last write, {thread: last read}]
        self.races = {}        # (lines, kinds, buffer) -> Race
        self.by_thread = {}    # thread id -> [Access] in order (for the hints)
        self.accesses = 0
        self.painters = []     # host writes, in order
        self.painted = (np.zeros(0, np.int64),) * 3   # disjoint [start, end) location ranges -> index in painters
        self.sorted_keys = np.zeros(0, np.int64)      # the shadow's keys, sorted (rebuilt when it has grown)

    def thread(self, rank, call, program):
        kernel = self.kernels[(rank, call)]
        key = (rank, kernel["name"], program)
        t = self.threads.get(key)
        if t is None:
            t = self.threads[key] = len(self.threads)
            self.clocks[t] = {}
        if self.instance.get(t) != (rank, call):
            _join(self.clocks[t], kernel["fork"])
            self.instance[t] = (rank, call)
            kernel["threads"].add(t)
        return t

    def start(self, rank, call, name, stream):
        host = self.host.setdefault(rank, {})
        host[("host", rank)] = host.get(("host", rank), 0) + 1
        fork = dict(self.streams.get((rank, stream), {}))
        _join(fork, host)
        self.kernels[(rank, call)] = dict(name=name, stream=stream, fork=fork, threads=set())

    def end(self, rank, call):
        kernel = self.kernels[(rank, call)]
        done = dict(kernel["fork"])
        for t in kernel["threads"]:
            _join(done, self.clocks[t])
        self.streams[(rank, kernel["stream"])] = done

    def host_event(self, rank, kind, details):
        """``join``: a stream waits for another stream (``waits_for``) or for an event (``event``); ``record``: an
        event takes the clock of the stream it is recorded on; ``sync``: the host waits for one stream, one
        event, or (neither named) all its streams."""
        host = self.host.setdefault(rank, {})
        if kind == "join":
            into = self.streams.setdefault((rank, details["into"]), {})
            _join(into, self.events.get((rank, details["event"]), {}) if "event" in details else
                  self.streams.get((rank, details["waits_for"]), {}))
        elif kind == "record":
            self.events[(rank, details["event"])] = dict(self.streams.get((rank, details["stream"]), {}))
        elif kind == "sync" and "event" in details:
            _join(host, self.events.get((rank, details["event"]), {}))
        elif kind == "sync" and "stream" in details:
            _join(host, self.streams.get((rank, details["stream"]), {}))
        elif kind == "sync":
            for (r, _), clock in self.streams.items():
                if r == rank:
                    _join(host, clock)
        elif kind == "arrive":   # a host collective (torch.distributed's barrier, all_gather...): what each rank did
            _join(self.meetings.setdefault(details["meeting"], {}), host)   # before it is known to all after it
        elif kind == "leave":    # (every rank arrives before any leaves, so the shared order has them all by now)
            _join(host, self.meetings.get(details["meeting"], {}))

    def access(self, rank, event):
        _, seq, call, program, kind, atomic, sem, scope, op, keys, size, where, buffer, owner, time_ns, values = event
        t = self.thread(rank, call, program)
        clock = self.clocks[t]
        clock[t] = clock.get(t, 0) + 1
        if sem in ACQUIRES:
            for key in keys.tolist():
                seen = self.release.get(key)
                if seen:
                    _join(clock, seen)
        a = Access(seq, rank, call, program, self.kernels[(rank, call)]["name"], t, clock[t], kind, bool(atomic), sem,
                   where, buffer, owner, keys, time_ns, op, values)
        self.accesses += 1
        self.by_thread.setdefault(t, []).append(a)
        writes = kind != "read"
        # A location seen for the first time: its last write is the last host write over it, if any.
        painters = _inside(*self.painted[:2], keys) if self.painters else None
        for i, key in enumerate(keys.tolist()):
            entry = self.shadow.get(key)
            if entry is None:
                host = painters is not None and painters[i] >= 0
                entry = self.shadow[key] = [self.painters[self.painted[2][painters[i]]] if host else None, {}]
            last = entry[0]
            if last is not None:
                self._check(last, a, key, clock)
            if writes:
                for read in entry[1].values():
                    self._check(read, a, key, clock)
                entry[0], entry[1] = a, {}
            else:
                entry[1][t] = a
        if kind == "rmw":
            if sem in RELEASES:
                frozen = dict(clock)
                for key in keys.tolist():
                    before = self.release.get(key)
                    if before:
                        merged = dict(before)
                        _join(merged, frozen)
                        self.release[key] = merged
                    else:
                        self.release[key] = frozen
        elif kind == "write":
            for key in keys.tolist():
                self.release.pop(key, None)

    def host_write(self, rank, event):
        """A host write over the location ranges [lo, hi): see the module's docstring for what orders it."""
        _, seq, op, lo, hi, where, buffer, owner, stream, time_ns = event
        host = self.host.setdefault(rank, {})
        me = ("host", rank)
        host[me] = host.get(me, 0) + 1
        clock = dict(self.streams.get((rank, stream), {}))
        _join(clock, host)
        a = Access(seq, rank, 0, 0, "host", me, host[me], "write", False, None, where, buffer, owner, lo, time_ns, op)
        self.accesses += 1
        # The locations kernels touched before: checked now, and this write is their last one.
        if self.sorted_keys.size != len(self.shadow):
            self.sorted_keys = np.sort(np.fromiter(self.shadow, np.int64, len(self.shadow)))
        keys = self.sorted_keys
        for key in keys[_inside(lo, hi, keys) >= 0].tolist():
            entry = self.shadow[key]
            if entry[0] is not None:
                self._check(entry[0], a, key, clock)
            for read in entry[1].values():
                self._check(read, a, key, clock)
            entry[0], entry[1] = a, {}
        if self.release:   # (a plain write ends a release sequence)
            held = np.fromiter(self.release, np.int64, len(self.release))
            for key in held[_inside(lo, hi, held) >= 0].tolist():
                del self.release[key]
        # The others: the map of the last host write over each range, which a later first access reads.
        self.painters.append(a)
        starts, ends, who = self.painted
        cuts = np.unique(np.concatenate([starts, ends, lo, hi]))
        pieces = cuts[:-1]
        old = _inside(starts, ends, pieces)
        writer = np.where(_inside(lo, hi, pieces) >= 0, len(self.painters) - 1,
                          np.where(old >= 0, who[np.maximum(old, 0)] if who.size else -1, -1))
        keep = writer >= 0
        pieces, piece_ends, writer = pieces[keep], cuts[1:][keep], writer[keep]
        first = np.concatenate([[True], (pieces[1:] != piece_ends[:-1]) | (writer[1:] != writer[:-1])])
        last = np.concatenate([first[1:], [True]])
        self.painted = (pieces[first], piece_ends[last], writer[first])

    def _check(self, earlier, later, key, clock):
        if earlier.thread == later.thread or (earlier.atomic and later.atomic):
            return
        if earlier.clock <= clock.get(earlier.thread, 0):
            return
        # One report per pair of lines (in either order) and buffer: the same mistake on every rank and tile.
        name = (tuple(sorted([(earlier.line, earlier.kind), (later.line, later.kind)])),
                (later if earlier.on_host else earlier).buffer[0], earlier.rank == later.rank)
        race = self.races.get(name)
        if race is None:
            race = self.races[name] = Race(earlier, later, key)
        else:
            race.locations += 1
        if len(race.pairs) < MAX_PAIRS and (earlier.seq, later.seq) not in race.seen:
            race.seen.add((earlier.seq, later.seq))
            race.pairs.append((earlier, later))


def _inside(starts, ends, keys):
    """For each key, the index of the range [starts[i], ends[i]) that holds it (sorted, disjoint ranges), else -1."""
    i = np.searchsorted(starts, keys, side="right") - 1
    return np.where((i >= 0) & (keys < ends[np.maximum(i, 0)] if ends.size else False), i, -1)


def _releases_after(access, by_thread):
    return [x for x in by_thread.get(access.thread, []) if x.seq > access.seq and x.sem in RELEASES and x.kind == "rmw"]


def _acquires_of(access, release, by_thread):
    """The acquires of ``release``'s location by ``access``'s program, in the same kernel call."""
    keys = set(release.keys.tolist())
    return [x for x in by_thread.get(access.thread, []) if x.sem in ACQUIRES and x.call == access.call and
            keys & set(x.keys.tolist())]


def _stale_value(acquire, release, by_thread, kernels):
    """What an acquire that came too early saw: a value the releasing program left in an earlier kernel call
    (a flag signalled with a constant and never reset, Iris issue #465), or an older one."""
    if not acquire.values:
        return ""
    keys = set(release.keys.tolist())
    older = [x for x in by_thread.get(release.thread, []) if x.seq < acquire.seq and x.call < release.call
             and x.sem in RELEASES and keys & set(x.keys.tolist())]
    if not older:
        return f" (it saw {acquire.values[0]:g}, an older value)"
    left = older[-1]
    return (f" (it saw {acquire.values[0]:g}, which rank {left.rank} left at {left.line} in an earlier kernel launch, "
            f"{_launch_of_its_kernel(left, kernels)}; this write is in {_launch_of_its_kernel(release, kernels)}: "
            f"a flag that keeps its value from one launch to the next needs a value only this launch sets, or a reset "
            f"before each launch)")


def _launch_of_its_kernel(access, kernels):
    """``rank 1's 2nd launch of all_reduce_one_shot``: launches of the same kernel by the same rank, counted
    (``kernels``: the order's (rank, call) -> launch; the rank's call numbers also count the barrier kernels gemmar
    and the program launch in between)."""
    calls = [call for (rank, call), launch in kernels.items()
             if rank == access.rank and launch["name"] == access.kernel and call <= access.call]
    n = len(calls)
    nth = f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
    return f"rank {access.rank}'s {nth} launch of {access.kernel}"


def _hint(race, by_thread, names, kernels):
    """What would order the two sides. A plain store against an atomic is a flag written without release.
    Otherwise the intended direction is the one where one side's program releases a flag after its access
    and the other side's program acquires that flag somewhere; the hint says whether it acquired too early,
    too late (after its access), or never."""
    a, b = race.first, race.second
    for host, other in ((a, b), (b, a)):
        if host.on_host:
            if other.rank == host.rank:
                return (f"a synchronize (or a wait_stream) between rank {host.rank}'s kernel and its host's write would "
                        f"order them.")
            return (f"a barrier of both ranks between rank {host.rank}'s host write and {other.who()} (after the write "
                    f"and before the kernel's launch, or after the kernel and before the write) would order them.")
    for plain, other in ((a, b), (b, a)):
        if plain.kind == "write" and not plain.atomic and other.atomic:
            return (f"{plain.who()} writes this flag with a plain store: publish it with a release atomic "
                    f"(atomic_xchg or atomic_add with sem=\"release\", scope=\"sys\").")

    def fit(x, y):
        """How well "x's program releases a flag after its access, y's acquires it before its own" explains the
        race: y acquires it only after its access (3: the wait is misplaced), never (2), or before it, an
        older value (1); x releases nothing after its access (0)."""
        after = _releases_after(x, by_thread)
        if not after:
            return 0
        acquires = _acquires_of(y, after[0], by_thread)
        if not acquires:
            return 2
        return 1 if any(q.seq < y.seq for q in acquires) else 3

    # The order the memory saw is the intended one (it usually gave the right values), unless the other
    # side's program waits on the flag only after its access: then that wait is misplaced.
    forward, backward = fit(a, b), fit(b, a)
    # A side that acquired the other's flag, too early or an older value, explains it better than one that
    # released nothing (a stale flag: the read came first only because the flag still held an old value).
    if backward == 3 > forward or (forward == 0 and backward in (1, 3)) or \
            (forward == backward == 0 and a.kind == "read" != b.kind):
        a, b = b, a   # (with no release on either side: a write, then the read it should come before)
    after = _releases_after(a, by_thread)
    if not after:
        return (f"{a.who()} releases nothing after {ACTING[a.kind]} it: make this {a.kind} a release atomic, or "
                f"follow it with one on a flag that {b.who()} acquires before its {b.kind}.")
    release = after[0]
    flag = names(release)
    acquires = _acquires_of(b, release, by_thread)
    later = [x for x in acquires if x.seq > b.seq]
    earlier = [x for x in acquires if x.seq < b.seq]
    if earlier:
        return (f"{b.who()} acquires {flag} at {earlier[-1].line} first, but not the value {a.who()} releases "
                f"at {release.line} after this {a.kind}{_stale_value(earlier[-1], release, by_thread, kernels)}: wait for "
                f"that value.")
    if later:
        return (f"{b.who()} {b.doing()} it before its acquire of {flag} at {later[0].line}, which would see the "
                f"release {a.who()} makes at {release.line} after this {a.kind}.")
    return (f"{a.who()} releases {flag} at {release.line} after this {a.kind}, but {b.who()} never acquires it: "
            f"wait on that flag before the {b.kind}.")


def analyse(records):
    """The ranks' records (``Recorder.take()``) -> SanitizerReport."""
    events = sorted(((event[1], record["rank"], event) for record in records for event in record["events"]),
                    key=lambda item: item[0])
    order = _Order()
    for _, rank, event in events:
        what = event[0]
        if what == "access":
            order.access(rank, event)
        elif what == "start":
            order.start(rank, event[2], event[3], event[4])
        elif what == "end":
            order.end(rank, event[2])
        elif what == "host write":
            order.host_write(rank, event)
        else:
            order.host_event(rank, event[2], event[3])

    def names(access):
        key = int(access.keys[0])
        offset = key & ((1 << OWNER_SHIFT) - 1)
        name, shape, dtype, start = access.buffer
        return f"{element_text((name, shape, dtype), offset - start)} (rank {key >> OWNER_SHIFT}'s)"

    races = sorted(order.races.values(), key=lambda r: r.second.seq)
    for race in races:
        race.hint = _hint(race, order.by_thread, names, order.kernels)
    return SanitizerReport(races, order.accesses, len(records))
