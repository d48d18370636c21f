"""One run's settings: ``RunConfig`` (the fused GEMM + all-reduce) and ``AllReduceConfig`` (the standalone
all-reduce), frozen, each with its ``validate``, the check of every setting (a one-line UsageError naming the
bad value), run where a run comes in from the Python API or the CLI; below, the config is read as it is.
What the machine decides (memory, GPUs, heap size) is checked where the machine is known (``runtime/``)."""

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

from .errors import UsageError


class _TorchDtypes(Mapping):
    """Dtype name -> torch dtype. The names are known without torch, which is imported on the first look-up:
    the command line refuses a bad flag without waiting seconds for torch (issue 61)."""

    NAMES = ("fp16", "bf16", "fp32")

    def __getitem__(self, name):
        if name not in self.NAMES:
            raise KeyError(name)
        import torch

        return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]

    def __iter__(self):
        return iter(self.NAMES)

    def __len__(self):
        return len(self.NAMES)


DTYPES = _TorchDtypes()
BACKENDS = ("auto", "cpu", "cuda", "iris")
SCHEMES = ("two_shot", "one_shot")   # the standalone all-reduce's (runtime/allreduce.py)
IRIS_AMD_ONLY = ("two_tiles", "waves_per_eu", "mfmaInstrSize", "kpack")   # Iris's AMD compiler flags: mean nothing here

MAX_DIM = 1 << 20            # a side longer than this is a typo, not a workload
MAX_WORLD_SIZE = 64
MAX_PROGRAMS = 4096
MIN_BLOCK, MAX_BLOCK = 16, 256   # tl.dot needs 16 on each side; 256 keeps a tile in registers


def dtype_name(dtype):
    """'fp16' / 'bf16' / 'fp32' for a torch dtype or one of those names; UsageError otherwise."""
    for name, torch_dtype in DTYPES.items():
        if dtype in (name, torch_dtype):
            return name
    raise UsageError(f"datatype {dtype!r} is not supported: use one of {', '.join(DTYPES)}")


def k_bounds(K, world_size, rank):
    """The K-slice [start, end) that ``rank`` holds. Uneven K: the first K % world_size ranks get one more."""
    base, extra = divmod(K, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def waves(tiles, programs):
    """(tiles in the whole waves before the last, tiles in the last wave) when ``programs`` persistent programs
    take ``tiles`` tiles in turn: the last wave is the one split-K may cut (RunConfig.whole_tiles)."""
    whole = programs * ((tiles - 1) // programs)
    return whole, tiles - whole


def _positive_int(name, value, largest):
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name}={value!r} is not an integer: use a whole number from 1 to {largest}")
    if not 1 <= value <= largest:
        raise UsageError(f"{name}={value} is out of range: use a whole number from 1 to {largest}")


# Split-K (RunConfig.split_k): the algorithms whose world-size-1 launch can cut K, and the most slices a tile takes.
SPLIT_K_ALGORITHMS = ("two_shot", "one_shot")
MAX_SPLIT_K = 64
MAX_GEMV_PROGRAMS = 1 << 16   # the few-rows kernel's programs (column tiles x K slices): 2**20 columns in 16-wide tiles

# The shortest watchdog: under the interpreter one rank's programs run one after another, so a wait for a
# peer's program can last that long with nothing wrong (0.001 s reported deadlocks that were not).
MIN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class RunConfig:
    """Everything that fixes one fused GEMM + all-reduce run. Frozen: checked once where it comes in
    (:meth:`validate`), it travels down unchanged; a derived run is ``dataclasses.replace(config, ...)``."""

    m: int = 256
    n: int = 256
    k: int = 256
    datatype: str = "fp16"
    algorithm: str = "ring"
    BLK_M: int = 32
    BLK_N: int = 32
    BLK_K: int = 32
    gsize_m: int = 4
    num_sms: int = 4            # persistent GEMM programs per rank
    comm_sms: int = 1           # communication programs per rank, besides the GEMM's (two_shot)
    world_size: int = 2
    iterations: int = 1
    timeout_s: float = 60.0     # watchdog on every spin-wait
    trace: bool = False
    seed: int = 0
    # Compiled-GPU tuning; ignored by the interpreter.
    num_warps: int = 4
    num_stages: int = 3
    # Split-K: the K of each tile of the last wave cut into this many slices, each a unit of work for its own
    # program (two_shot and one_shot at world size 1, where a few rows and a long K, or a wave and a bit, leave SMs
    # without a tile; the tiles before the last wave run whole: whole_tiles). With more slices than programs, the
    # last wave's K steps are shared equally among all programs, across tiles (stream-K): k_shares.
    split_k: int = 1
    # Few rows at world size 1 (two_shot, one_shot; two_shot.one_rank_gemv): all of M in one row of tiles (BLK_M >= m), one
    # program per column tile and K slice (split_k slices each), not persistent: num_sms becomes that count.
    gemv: bool = False
    # The dtype of C, and (two_shot) of the partial tiles that travel between ranks. None: the algorithm's
    # choice - atomics and ring sum in C itself, which must be fp32; two_shot sends and returns the input dtype.
    out_dtype: str = None
    wire_dtype: str = None
    # A straggler for stress tests: before each launch, rank delay_rank waits a random 0.5..1 x delay_us (seeded).
    delay_rank: int = -1
    delay_us: float = 0.0
    # cpu only: record every heap access and report races and out-of-bounds accesses (gemmar/sanitizer).
    sanitize: bool = False

    def __new__(cls, *args, **settings):
        return _refuse_unknown_settings(cls, settings)

    @classmethod
    def from_settings(cls, settings, **fixed):
        """The Python API's checked RunConfig from keyword settings (an unknown name: one line)."""
        return cls(**{**settings, **fixed}).validate()

    @property
    def checked(self):
        """Whether this config came out of :meth:`validate` (below the boundary nothing checks it again)."""
        return self.__dict__.get("_checked", False)

    def validate(self):
        """The boundary's one check: raise UsageError (one line) for the first bad value; else return the
        checked config, dtypes by name (a new one: a frozen config is never changed)."""
        if self.checked:
            return self
        for name in ("m", "n", "k"):
            _positive_int(name, getattr(self, name), MAX_DIM)
        self = replace(self, datatype=dtype_name(self.datatype))   # (from here on: the new config, not the given)
        spec = self.spec
        for name in ("BLK_M", "BLK_N", "BLK_K"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not MIN_BLOCK <= value <= MAX_BLOCK or \
                    value & (value - 1):
                raise UsageError(f"{name}={value!r} is not allowed: use a power of two from {MIN_BLOCK} to "
                                 f"{MAX_BLOCK} ({', '.join(str(1 << i) for i in range(MIN_BLOCK.bit_length() - 1, MAX_BLOCK.bit_length()))})")
        for name in ("trace", "sanitize", "gemv"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name}={getattr(self, name)!r} is not allowed: use True or False")
        _positive_int("gsize_m", self.gsize_m, MAX_PROGRAMS)
        _positive_int("num_sms", self.num_sms, MAX_PROGRAMS)
        _positive_int("world_size", self.world_size, MAX_WORLD_SIZE)
        if spec.comm_programs:
            _positive_int("comm_sms", self.comm_sms, MAX_PROGRAMS)
        self = replace(self, **{name: dtype_name(getattr(self, name)) for name in ("out_dtype", "wire_dtype")
                                if getattr(self, name) is not None})
        if spec.c_dtype is None and self.out_dtype not in (None, "fp32"):
            raise UsageError(f"out_dtype={self.out_dtype} is not allowed with {self.algorithm}: it sums in C itself, "
                             f"so C is fp32")
        if not spec.wire_dtype and self.wire_dtype is not None:
            raise UsageError(f"wire_dtype={self.wire_dtype} is not allowed with {self.algorithm}: its partials "
                             f"have no dtype of their own on the wire")
        if not (isinstance(self.delay_rank, int) and -1 <= self.delay_rank < self.world_size):
            raise UsageError(f"delay_rank={self.delay_rank!r} is not allowed: use -1 (none) or a rank from 0 to "
                             f"{self.world_size - 1}")
        if not (isinstance(self.delay_us, (int, float)) and 0 <= self.delay_us <= 10_000_000):
            raise UsageError(f"delay_us={self.delay_us!r} is not allowed: use microseconds from 0 to 1e7")
        _positive_int("iterations", self.iterations, 1_000_000)
        _positive_int("num_warps", self.num_warps, 32)
        if self.num_warps & (self.num_warps - 1):
            raise UsageError(f"num_warps={self.num_warps} is not allowed: use a power of two from 1 to 32")
        _positive_int("num_stages", self.num_stages, 8)
        _positive_int("split_k", self.split_k, MAX_SPLIT_K)
        if self.split_k > 1:
            if self.algorithm not in SPLIT_K_ALGORITHMS or self.world_size != 1:
                raise UsageError(f"split_k={self.split_k} is not allowed with {self.algorithm} at world size "
                                 f"{self.world_size}: split-K runs with {' or '.join(SPLIT_K_ALGORITHMS)} at world "
                                 f"size 1 only (use split_k=1)")
            steps = -(-self.k // self.BLK_K)
            if self.split_k > steps:
                raise UsageError(f"split_k={self.split_k} is more than the {steps} steps of BLK_K={self.BLK_K} in "
                                 f"K={self.k}: use at most {steps}")
            # (the kernel finds a share's place as step x programs in 32 bits; the gemv kernel, as step x slices)
            cut_steps = self.cut_tiles * steps
            if cut_steps * self.k_sharing >= 2 ** 31 and not self.gemv:
                raise UsageError(f"split_k={self.split_k} with num_sms={self.num_sms}: the last wave's {cut_steps} "
                                 f"K steps x its programs pass 2**31: use fewer programs, a larger BLK_K or split_k=1")
        if self.gemv:
            if self.algorithm not in SPLIT_K_ALGORITHMS or self.world_size != 1:
                raise UsageError(f"gemv=True is not allowed with {self.algorithm} at world size {self.world_size}: the "
                                 f"few-rows kernel runs with {' or '.join(SPLIT_K_ALGORITHMS)} at world size 1 only")
            if self.BLK_M < self.m:
                raise UsageError(f"gemv=True needs all of M in one row of tiles: BLK_M={self.BLK_M} is less than "
                                 f"m={self.m}: use BLK_M >= m (at most {MAX_BLOCK}) or gemv=False")
            # (one program per column tile and K slice: the launch's program count, whatever num_sms was given)
            if self.tile_count * self.split_k > MAX_GEMV_PROGRAMS:
                raise UsageError(f"gemv=True with n={self.n}, BLK_N={self.BLK_N} and split_k={self.split_k} makes "
                                 f"{self.tile_count * self.split_k} programs: use at most {MAX_GEMV_PROGRAMS} (a wider "
                                 f"BLK_N or fewer slices)")
            self = replace(self, num_sms=self.tile_count * self.split_k)
        if isinstance(self.timeout_s, bool) or not (isinstance(self.timeout_s, (int, float)) and
                                                    MIN_TIMEOUT_S <= self.timeout_s <= 86400):
            raise UsageError(f"timeout_s={self.timeout_s!r} is not allowed: use seconds from {MIN_TIMEOUT_S:g} to "
                             f"86400 (a shorter wait is no sign of a hang)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63:
            raise UsageError(f"seed={self.seed!r} is not allowed: use a whole number from 0 to 2**63 - 1")
        object.__setattr__(self, "_checked", True)   # (on the new config, before anyone else holds it)
        return self

    @property
    def torch_dtype(self):
        return DTYPES[self.datatype]

    @property
    def spec(self):
        """The algorithm's AlgorithmSpec (``gemmar/algorithms.py``)."""
        from .algorithms import get

        return get(self.algorithm)

    @property
    def c_dtype(self):
        """The dtype of the all-reduced C: out_dtype, else the algorithm's choice (fp32 if it sums in C)."""
        if self.out_dtype is not None:
            return DTYPES[self.out_dtype]
        import torch

        spec = self.spec
        return spec.c_dtype(self) if spec.c_dtype is not None else torch.float32

    @property
    def wire_torch_dtype(self):
        """The dtype partial tiles travel in, for an algorithm that has one (the input dtype unless wire_dtype
        says otherwise)."""
        return DTYPES[self.wire_dtype] if self.wire_dtype is not None else self.torch_dtype

    @property
    def programs(self):
        """Programs launched per rank: the GEMM's, and the communication programs after them."""
        return self.num_sms + (self.comm_sms if self.spec.comm_programs else 0)

    @property
    def tiles(self):
        """(tiles along M, tiles along N)."""
        return -(-self.m // self.BLK_M), -(-self.n // self.BLK_N)

    @property
    def tile_count(self):
        tiles_m, tiles_n = self.tiles
        return tiles_m * tiles_n

    @property
    def whole_tiles(self):
        """Tiles whose K is not cut: with split-K, those before the last wave of ``num_sms`` programs (a whole
        wave takes as long cut or not; the last, part-filled one is what slices fill). Without it, all."""
        if self.split_k == 1:
            return self.tile_count
        return waves(self.tile_count, self.num_sms)[0]

    @property
    def cut_tiles(self):
        """Tiles whose K is cut (split-K's last wave; 0 without split-K)."""
        return self.tile_count - self.whole_tiles

    @property
    def k_sharing(self):
        """Programs sharing the cut tiles' K steps: min(num_sms, cut tiles x split_k)."""
        return min(self.num_sms, self.cut_tiles * self.split_k)

    @property
    def k_shares(self):
        """Split-K (two_shot.one_rank_split_gemm): the last wave's K steps, end to end, cut into ``k_sharing``
        equal shares, a program's each. (sharing, parts): ``parts[program]``, the cut tiles (their index among
        the cut ones) its share touches, in order."""
        steps = -(-self.k // self.BLK_K)
        cut_steps = self.cut_tiles * steps
        sharing = self.k_sharing
        parts = []
        for program in range(sharing):
            first, end = program * cut_steps // sharing, (program + 1) * cut_steps // sharing
            parts.append(list(range(first // steps, -(-end // steps))) if end > first else [])
        return sharing, parts

    @property
    def work_units(self):
        """The GEMM's units of work a launch: a whole tile, or the part of a program's K share in a cut tile."""
        if self.split_k == 1:
            return self.tile_count
        return self.whole_tiles + sum(len(touched) for touched in self.k_shares[1])

    @property
    def most_units_a_program(self):
        """The most units of work (as work_units counts them) one GEMM program does in a launch."""
        if self.split_k == 1:
            return -(-self.tile_count // self.num_sms)
        return self.whole_tiles // self.num_sms + max(len(touched) for touched in self.k_shares[1])

    def to_dict(self):
        return asdict(self)


def _refuse_unknown_settings(cls, settings):
    """A config's ``__new__``: an unknown setting is refused in one line that names it and the known ones (not a
    TypeError)."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UsageError(f"setting {unknown[0]!r} is not known: use {cls.__name__}'s names ({', '.join(sorted(known))})")
    return object.__new__(cls)


@dataclass(frozen=True)
class AllReduceConfig:
    """One run of the standalone all-reduce (``Cluster.all_reduce``, ``gemmar allreduce``; ``runtime/allreduce.py``):
    frozen, checked once where it comes in (:meth:`validate`), read as it is on the ranks."""

    numel: int                  # values per rank
    datatype: str = "bf16"
    comm_sms: int = None        # programs per rank; None: the device's default (runtime/allreduce.py)
    iterations: int = 3         # checked launches
    seed: int = 0
    timeout_s: float = 60.0     # watchdog on every spin-wait
    reps: int = 0               # GPU: timed launches (0: not timed)
    baseline: bool = False      # GPU: time NCCL (and torch's symmetric memory) too
    scheme: str = "auto"        # SCHEMES, or auto
    on_heap: bool = False       # the values already lie in the heap's input: no copy in
    sanitize: bool = False      # cpu: record the launches' heap accesses

    def __new__(cls, *args, **settings):
        return _refuse_unknown_settings(cls, settings)

    @property
    def checked(self):
        return self.__dict__.get("_checked", False)

    @property
    def torch_dtype(self):
        return DTYPES[self.datatype]

    def validate(self):
        """Raise UsageError (one line) for the first bad value; else return the checked config (dtype by name)."""
        if self.checked:
            return self
        for name, smallest in (("numel", 1), ("iterations", 1), ("reps", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not smallest <= value <= 2 ** 40:
                raise UsageError(f"{name}={value!r} is not allowed: use a whole number from {smallest} up")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise UsageError(f"seed={self.seed!r} is not allowed: use a whole number")
        config = replace(self, datatype=dtype_name(self.datatype))
        if config.comm_sms is not None:
            _positive_int("comm_sms", config.comm_sms, MAX_PROGRAMS)
        if config.scheme not in (*SCHEMES, "auto"):
            raise UsageError(f"scheme {config.scheme!r} is not known: use one of {', '.join(SCHEMES)} or auto")
        for name in ("baseline", "on_heap", "sanitize"):
            if not isinstance(getattr(config, name), bool):
                raise UsageError(f"{name}={getattr(config, name)!r} is not allowed: use True or False")
        if isinstance(config.timeout_s, bool) or not (isinstance(config.timeout_s, (int, float)) and
                                                      MIN_TIMEOUT_S <= config.timeout_s <= 86400):
            raise UsageError(f"timeout_s={config.timeout_s!r} is not allowed: use seconds from {MIN_TIMEOUT_S:g} "
                             f"to 86400")
        object.__setattr__(config, "_checked", True)   # (on the new config, before anyone else holds it)
        return config
