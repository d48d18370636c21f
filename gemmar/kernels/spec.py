"""What one fused GEMM + all-reduce algorithm is, in one object: :class:`AlgorithmSpec`.

Each kernel module ends with its ``SPEC`` (``atomics.py``, ``ring.py``, ``two_shot.py``, ``one_shot.py``); the registry
(``gemmar/algorithms.py``) lists them. Everything outside the kernel modules - the launcher, the trace
table, the replay, the figures, the puzzles, the CLI's choices - reads an algorithm through its spec, so a
new algorithm (a user's own, in a notebook cell or a file) is one spec and its kernels:

- **buffers**: ``buffers(alloc, config, world_size) -> object``: every symmetric-heap allocation, made
  through ``alloc(shape, dtype)``. The launcher calls it with the rank's heap; the heap size a run needs
  is found by calling the same function with an allocator that only counts.
- **launches**: ``launches(ctx) -> [Launch]``: the kernels of one launch with their grids, streams and
  keyword arguments (``ctx`` is a :class:`LaunchContext`: the config, the heap, the buffers, A and B, the
  trace buffers, the parts). Arguments named in ``Launch.per_launch`` change every launch
  (``epoch``: how many launches came before; ``parity``: epoch % 2).
- **output**: ``output(buffers, epoch) -> C``: where launch ``epoch``'s all-reduced C is.
- **phases**: the events its kernels record (:class:`Phase`): kind id, name, colour group (gemm, wait,
  comm, reduce, store), what a wait waits for, in words; the legend text of a group where it means
  something else here (``labels``); and how many events a launch records (``events_per_program``,
  ``events_per_launch``), so the trace buffer is sized right and a trace is known complete.
- **done**: the event after which a tile holds the full sum on a rank (``Done``), for the replay and the
  tile grid; ``flags``: replayed flag counters (a flag name -> the event kind that raises it at its peer).
- **wait_flags**: the flags its kernels wait on (a flag name -> the id each wait passes to
  ``device.wait_at_least``), so that a wait that expires is reported as a DeadlockError naming the flag.
- **parts**: the @triton.jit functions a puzzle may replace (:class:`Part`: the reference function itself;
  a participant's signature is checked against it), and **mistake_parts**: the teaching bugs, by name, each
  some of those parts swapped (``kernels/mistakes.py``); a kernel holds no branch for a mistake.
- **c_dtype**: the dtype of the all-reduced C for a config.

A spec's functions and kernels are plain Python and Triton: to run a user's spec on the ranks its source
travels there (``runtime/shipping.py``), as a puzzle's parts do.
"""

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import UsageError
from .device import wait_for_tile

PHASE_GROUPS = ("gemm", "wait", "comm", "reduce", "store")


@dataclass(frozen=True)
class Phase:
    """One kind of event a kernel records."""

    kind_id: int               # the number the kernel writes (1..255); unique within the algorithm
    name: str                  # e.g. "slot_wait"
    group: str                 # colour group: one of PHASE_GROUPS
    waits_for: str = ""        # wait phases: what the wait is for, a format string over the event's fields
    whole_launch: bool = False  # about no single tile: its tile, pid_m and pid_n are -1

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Done:
    """When a tile holds the full sum: at the end of a ``kind`` event on ``where`` - "rank" (the rank that
    recorded it), "every_rank" (an owner writes every rank's C) or "peer" (the event's peer, once every
    rank's event of that kind for that peer and tile has ended)."""

    kind: str
    where: str = "rank"


@dataclass(frozen=True)
class Part:
    """A @triton.jit function of a kernel that a puzzle may replace: ``reference`` is the kernel's own."""

    reference: object
    returns: str

    @property
    def arguments(self):
        return tuple(inspect.signature(self.reference.fn).parameters)


# The waits a kernel takes as parts (so that a mistake can swap one): every one is device.wait_for_tile.
WAIT_PART = Part(wait_for_tile, "nothing: it returns once *flag >= target")


@dataclass
class Launch:
    """One kernel of a launch: ``kernel[grid](**kwargs)`` on ``stream`` (None: the rank's stream; "side":
    its side stream, which the rank's next launch waits for)."""

    kernel: object
    grid: tuple
    kwargs: dict
    stream: str = None
    per_launch: tuple = ()      # argument names that change every launch: "epoch", "parity"
    # Whether its programs may wait for others or be waited for: then they must all be resident at once, and share
    # SMs with the other kernels' (launch.share_sms). False: a kernel alone whose programs wait for nobody.
    waits: bool = True


@dataclass
class LaunchContext:
    """What an algorithm's ``launches`` gets: one rank's run."""

    config: object              # RunConfig
    heap: object                # the rank's SymmetricHeap
    buffers: object             # what the spec's ``buffers`` returned
    A: object                   # this rank's A_r and B_r, as the GEMM reads them (tensors or TMA descriptors)
    B: object
    K: int                      # this rank's K-slice length (A_r's columns)
    strides: dict               # stride_am, stride_ak, stride_bk, stride_bn (of the tensors)
    gemm: dict                  # the persistent GEMM's constexprs (BLOCK_M/N/K, GROUP_SIZE_M, NUM_SMS, ...)
    trace: object               # this rank's trace buffer and per-program counts
    trace_counts: object
    parts: dict                 # part name -> @triton.jit function (the kernel's own, a mistake's, a participant's)
    watchdog: object            # int64 words the waits report an expired wait in
    gpu: bool

    @property
    def rank(self):
        return self.heap.rank

    @property
    def world_size(self):
        return self.heap.world_size

    @property
    def timeout_ns(self):
        return int(self.config.timeout_s * 1e9)

    @property
    def peer_cache(self):
        """The cache modifier for reading what peers wrote: from L2 (".cg") on GPUs, nothing under the
        interpreter."""
        return ".cg" if self.gpu else ""

    def trace_region(self, first_program, programs):
        """(trace, trace_counts) of programs ``first_program`` .. + ``programs`` - 1: a second kernel of the
        launch records into its own part of the rank's trace buffer."""
        from .events import EVENT_WORDS

        capacity = self.gemm["TRACE_CAPACITY"]
        start = first_program * capacity * EVENT_WORDS
        trace = self.trace[start:] if capacity else self.trace
        return trace, self.trace_counts[first_program:first_program + programs]

    def tuning(self, num_stages=None, num_warps=None, **kwargs):
        """``kwargs`` plus, on GPUs, num_warps and num_stages (the config's, or the ones given: a kernel with
        no loop to pipeline takes 1 stage). The interpreter takes neither."""
        if self.gpu:
            kwargs.update(num_warps=num_warps or self.config.num_warps,
                          num_stages=num_stages or self.config.num_stages)
        return kwargs


def _is_jit(fn):
    return inspect.isfunction(getattr(fn, "fn", None))


@dataclass
class AlgorithmSpec:
    """One fused GEMM + all-reduce algorithm: see the module's docstring for each field."""

    name: str
    summary: str
    buffers: Callable
    launches: Callable
    output: Callable
    phases: tuple
    done: Done
    c_dtype: Callable = None           # config -> C's dtype when out_dtype is not set; None: fp32, and only fp32
    #                                    (the algorithm sums in C itself)
    events_per_program: Callable = None  # (config, world_size) -> trace room per program
    events_per_launch: Callable = None   # (config, world_size, rank) -> events one rank records per launch
    labels: dict = field(default_factory=dict)   # colour group -> legend text, where it differs
    flags: dict = field(default_factory=dict)    # replayed flag -> event kind that raises it at its peer
    wait_flags: dict = field(default_factory=dict)  # flag name -> the id its waits pass to wait_at_least
    #                                                 (flag_kind), named in a DeadlockError
    parts: dict = field(default_factory=dict)    # name -> Part
    mistake_parts: dict = field(default_factory=dict)  # mistake name -> {part name: function in its place}
    comm_programs: bool = False        # launches comm_sms communication programs besides the GEMM's
    comm_beside_gemm: bool = False     # they are small enough to share an SM with a GEMM program: on Hopper
    #                                    GPUs the default is then one beside each (tuning.tuned_defaults)
    wire_dtype: bool = False           # partials travel in a dtype of their own (RunConfig.wire_dtype)
    barrier_after_launch: bool = False  # remote writes may be in flight until every rank has finished
    gpu_tuning: dict = field(default_factory=dict)  # GPU family ("hopper", "default") -> (BLK_M, BLK_N, BLK_K,
    #                                                 num_warps, num_stages, gsize_m), measured (docs/decisions.md)
    helpers: tuple = ()                # a user's spec: other functions its kernels call (shipped with it)
    builtin: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise UsageError(f"algorithm name {self.name!r} is not allowed: use a Python identifier like "
                             f"'one_shot'")
        for what in ("buffers", "launches", "output"):
            if not callable(getattr(self, what)):
                raise UsageError(f"algorithm {self.name}: {what} must be a function, got "
                                 f"{type(getattr(self, what)).__name__}")
        ids, names = [p.kind_id for p in self.phases], [p.name for p in self.phases]
        if not self.phases or not all(isinstance(p, Phase) for p in self.phases):
            raise UsageError(f"algorithm {self.name}: phases must be a non-empty tuple of Phase")
        if len(set(ids)) != len(ids) or len(set(names)) != len(names):
            raise UsageError(f"algorithm {self.name}: phase ids and names must be unique, got {list(zip(ids, names))}")
        for p in self.phases:
            if p.group not in PHASE_GROUPS or not 1 <= p.kind_id <= 255:
                raise UsageError(f"algorithm {self.name}: phase {p.name!r} needs a group from "
                                 f"{', '.join(PHASE_GROUPS)} and a kind id from 1 to 255 (got {p.group!r}, "
                                 f"{p.kind_id})")
        if self.done.kind not in names or self.done.where not in ("rank", "every_rank", "peer"):
            raise UsageError(f"algorithm {self.name}: done must name one of its phases ({', '.join(names)}) and "
                             f"where = rank, every_rank or peer")
        flag_ids = list(self.wait_flags.values())
        if not all(isinstance(i, int) and 0 < i < 2 ** 31 for i in flag_ids) or len(set(flag_ids)) != len(flag_ids):
            raise UsageError(f"algorithm {self.name}: wait_flags must give each flag name its own id from 1 to "
                             f"2**31 - 1, got {self.wait_flags}")
        for mistake, swaps in self.mistake_parts.items():
            if mistake == "none" or not isinstance(mistake, str) or not isinstance(swaps, dict) or not swaps or \
                    not set(swaps) <= set(self.parts):
                raise UsageError(f"algorithm {self.name}: mistake_parts must map each mistake's name (not 'none') to "
                                 f"{{part name: function}} over its parts ({', '.join(self.parts) or 'none'}); got "
                                 f"{mistake!r}: {swaps!r}")

    @property
    def mistakes(self):
        """The teaching mistakes' names, "none" first."""
        return ("none",) + tuple(self.mistake_parts)

    # -- what the rest of gemmar asks of an algorithm --------------------------------------------------
    def trace_room(self, config):
        """Events each program may record in one launch (the trace buffer's room per program)."""
        if self.events_per_program is None:
            raise UsageError(f"algorithm {self.name} cannot be traced: its spec gives no events_per_program")
        return int(self.events_per_program(config, config.world_size))

    def expected_events(self, config, rank):
        return None if self.events_per_launch is None else int(self.events_per_launch(config, config.world_size,
                                                                                      rank))

    def describe(self):
        """What a trace file needs to be read without this spec: its phases, done rule, flags and labels."""
        return dict(phases=[p.to_dict() for p in self.phases], done=dataclasses.asdict(self.done),
                    flags=dict(self.flags), labels=dict(self.labels))

    def check_parts(self, parts):
        """``parts`` ({name: @triton.jit function}) checked against this algorithm's replaceable parts."""
        if not isinstance(parts, dict):
            raise UsageError(f"parts must be a dict {{name: @triton.jit function}}, got {type(parts).__name__}")
        for name, fn in parts.items():
            if name not in self.parts:
                known = ", ".join(self.parts) or "none"
                raise UsageError(f"the {self.name} kernel has no part {name!r}: its parts are {known}")
            part = self.parts[name]
            if not _is_jit(fn):
                what = "a plain Python function" if inspect.isfunction(fn) else type(fn).__name__
                raise UsageError(f"{name} must be a @triton.jit function, got {what}: put @triton.jit on the line "
                                 f"above its def")
            given = list(inspect.signature(fn.fn).parameters)
            if len(given) != len(part.arguments):
                raise UsageError(f"{name} takes {len(part.arguments)} arguments ({', '.join(part.arguments)}) and "
                                 f"returns {part.returns}; {fn.fn.__name__} takes {len(given)} ({', '.join(given)})")

    def parts_for(self, given=None):
        """The parts a launch uses: the kernel's own, with ``given`` ({name: function}) in their place."""
        own = {name: part.reference for name, part in self.parts.items()}
        return {**own, **(given or {})}

    def mistake_swaps(self, mistake):
        """A teaching mistake as the parts it swaps ({part name: function}; none for "none")."""
        if mistake not in self.mistakes:
            raise UsageError(f"mistake {mistake!r} does not exist in {self.name!r}: use one of "
                             f"{', '.join(self.mistakes)}")
        return dict(self.mistake_parts.get(mistake, {}))

    def runs_its_own_parts(self, parts):
        """Whether a launch's ``parts`` are all this algorithm's own (no mistake's, no participant's)."""
        return all(parts[name] is part.reference for name, part in self.parts.items())


class CountingAllocator:
    """An allocator for a spec's ``buffers`` that allocates nothing and adds up what the heap would give."""

    def __init__(self, align, overhead):
        self.align, self.bytes = align, overhead

    def __call__(self, shape, dtype):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        numel = 1
        for side in shape:
            numel *= int(side)
        size = numel * torch.tensor([], dtype=dtype).element_size()
        self.bytes += -(-size // self.align) * self.align + self.align
        return torch.empty(shape, dtype=dtype, device="meta")
