"""One run's settings, checked in one place for the Python API and the CLI alike."""

from dataclasses import asdict, dataclass, fields

import torch

from .errors import UsageError

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
BACKENDS = ("auto", "cpu", "cuda", "iris")

MAX_DIM = 1 << 20            # a side longer than this is a typo, not a workload
MAX_WORLD_SIZE = 64
MAX_PROGRAMS = 4096
MIN_BLOCK, MAX_BLOCK = 16, 256   # tl.dot needs 16 on each side; 256 keeps a tile in registers


# Per-GPU starting points: (BLK_M, BLK_N, BLK_K, num_warps, num_stages, gsize_m). An algorithm's spec may
# give its own (AlgorithmSpec.gpu_tuning, measured: BENCHMARKS.md); these are for the others.
GPU_TUNING = {"hopper": (128, 128, 64, 8, 4, 8), "default": (128, 128, 32, 4, 3, 8)}
# Communication programs on GPUs, for an algorithm that has them (the rest of the SMs run the GEMM), when
# the problem's shape is not known; with it, split_programs chooses.
GPU_COMM_SMS = 16
# How many of 132 SMs the reduction needs to keep up with the GEMM at K_r = 2048: measured on one H200,
# world size 1, 8192 x 8192 C in 128 x 256 tiles (benchmarks/comm_programs.py, BENCHMARKS.md): 4, 8, 16, 24
# communication programs ran 3.56, 1.93, 1.27, 1.34 x torch.matmul (fewer cannot keep up; more take SMs from
# the GEMM). The reduction's work per rank is ~2 tile transfers per tile whatever W (reduce-scatter +
# all-gather), the GEMM's is K_r per tile: the need scales with 1 / K_r (at K_r 8192, 4 programs ran 1.037x,
# 16 ran 1.080x; at 14336, 4 ran 0.992x, 16 ran 1.107x). With W ranks an owner's program also waits for the
# slowest rank's partial of each tile, so more programs must be in flight: x (W + 1) / 2 (ranks sharing one
# H200, K_r 4096: W = 4 with 2 programs per rank ended 12 % of each launch after the last GEMM tile, with 3
# 0.5 %; W = 2 with 5, 1.6 %, with 7, 1.0-1.3 %).
COMM_SMS_AT_K2048 = 16
# Up to this many rows per rank a GEMM is "few rows": its tile comes from the algorithm's few-rows table
# (few_rows_tile) when its usual tile leaves SMs idle, and at world size 1 it reads A and B through plain pointers
# (launch.gemm_operands). Measured at M = 16, 64, 256 on one H200 (benchmarks/inference_sweep.py), the tiles
# also on 2 x H200.
FEW_ROWS = 512
TUNED_KNOBS = ("BLK_M", "BLK_N", "BLK_K", "num_warps", "num_stages", "gsize_m", "num_sms", "comm_sms")


# --algorithm auto: what to run, by where it runs. The rule follows the figures in BENCHMARKS.md ("The
# rule behind --algorithm auto"); change it only with new figures.
AUTO_RULE = {
    # One GPU per rank, W >= 2, where the shape is not known or the performance model does not speak
    # (cli.choose_auto asks the model first): on 2 x H200 atomics and ring were 1.05-1.08x and more slower than
    # cuBLAS then NCCL at the three large shapes (2026-12-01); two_shot, measured once (2026-12-04), was
    # 0.61-0.94x at 8 shapes of 16-8192 rows, but 1.21x and 1.34x at 256 and 64 rows before it took the
    # few-rows tiles there. One machine, one run each: without the shape, the library path stays the choice.
    "gpus": ("unfused", "without the shape there is no telling: on 2 x H200 two_shot measured 0.61-0.94x cuBLAS "
                        "then NCCL's time at 8 shapes (once each; 1.21-1.34x at 256 and 64 rows with a tile too "
                        "large for them), atomics and ring 1.05x and more at the large ones (BENCHMARKS.md)"),
    # One rank on one GPU: nothing to reduce, so torch.matmul alone is the whole job; a fused kernel can only
    # match it (on an H200, 2026-12-04: two_shot 1.00-1.15x torch.matmul at M = 64-8192, 1.14-1.32x at M = 16
    # where its launch's host time exceeds the GPU's work; atomics and ring 1.11-8.2x).
    "one_gpu": ("unfused", "with one rank there is nothing to reduce, so torch.matmul alone is the whole job and a "
                           "fused kernel can at best match it (on an H200 two_shot measured 1.00-1.15x torch.matmul's "
                           "time at 64-8192 rows and 1.14-1.32x at 16, atomics and ring 1.11-8.2x: BENCHMARKS.md)"),
    # CPU interpreter or ranks sharing a GPU: places to learn and test, with no NCCL between the ranks.
    "shared": ("two_shot", "there is no NCCL path between these ranks (cpu interpreter, or ranks sharing one "
                           "GPU), and two_shot is the fused kernel that gives every rank the same bits"),
}


def choose_algorithm(backend, world_size, gpus):
    """``--algorithm auto`` by the measured rule: (algorithm or "unfused", why), by AUTO_RULE. (With a GPU
    per rank, ``cli.choose_auto`` first asks the performance model about the shape.)"""
    if backend != "cuda" or world_size > gpus:
        return AUTO_RULE["shared"]
    return AUTO_RULE["one_gpu" if world_size == 1 else "gpus"]


def reads_by_tma(n, k, world_size, datatype):
    """Whether every rank's GEMM can read A and B through Hopper's tensor descriptors (``launch.gemm_operands``):
    16-bit values, and rows of B (N values) and of each rank's K-slice of A a multiple of 16 bytes."""
    if DTYPES[dtype_name(datatype)].itemsize != 2 or n % 8:
        return False
    return all((end - start) % 8 == 0 and end > start for start, end in (k_bounds(k, world_size, r)
                                                                         for r in range(world_size)))


def tuned_defaults(backend, algorithm, capability=(0, 0), multiprocessors=0, shape=None, given=None, trace=False,
                   tma=True, shared=False):
    """Settings that suit the device, for every knob the user did not set (``given``: the ones they did).
    On the cpu backend these are RunConfig's own defaults; on GPUs the algorithm's tile for the GPU's family
    and one program per SM, split between the GEMM and the communication programs by ``split_programs``
    when the problem's ``shape`` (M, N, K per rank, world size) is known. ``tma``: whether the GEMM will
    read through tensor descriptors (:func:`reads_by_tma`); ``shared``: the ranks share one GPU."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if backend == "cpu":
        defaults = RunConfig()
        return {knob: given.get(knob, getattr(defaults, knob)) for knob in TUNED_KNOBS}
    from .algorithms import get

    spec = get(algorithm)
    family = "hopper" if tuple(capability) >= (9, 0) else "default"
    tile = {**GPU_TUNING, **spec.gpu_tuning}[family]
    if shape is not None and (shape[3] == 1 or not shared):
        # At world size 1 (two_shot's launch is then the GEMM alone) and with a GPU per rank (on 2 x H200 the
        # few-rows tiles took two_shot from 1.21-1.34x cuBLAS then NCCL's time to 0.79-0.81x at 64 and 256
        # rows). Not for ranks sharing a GPU: unmeasured, and there every rank's programs must fit on it at
        # once (an 8-warp 128 x 128 tile was refused for 2 ranks at M = 300).
        tile = few_rows_tile(spec, family, tile, shape[0], shape[1], multiprocessors or 108)
    knobs = dict(zip(TUNED_KNOBS[:6], tile), **given)
    sms = multiprocessors or 108
    if not spec.comm_programs:
        comm = 0
    elif "comm_sms" in given:
        comm = given["comm_sms"]
    elif family == "hopper" and spec.comm_beside_gemm and tma and not (trace or given.get("trace")):
        # One communication program beside each GEMM program, on its SM (launch.share_sms): the GEMM keeps
        # every SM. On an H200 that took two_shot from 1.04-1.29x torch.matmul to 0.93-1.19x (BENCHMARKS.md).
        # Not when traced: recording events takes registers, and the traced pair did not fit on one SM
        # (76800 registers of 65536), so a traced run keeps the split below. Nor when the GEMM reads through
        # plain pointers (odd N or K-slices, fp32): that GEMM takes more registers, and 2 ranks sharing an
        # H200 at 1000 x 777 x 1999 needed 86016 of 65536 a SM (refused before launch; 2026-12-04).
        gemm = given.get("num_sms", sms)
        return {**knobs, "num_sms": gemm, "comm_sms": gemm}
    elif shape is not None:
        m, n, k_rank, world_size = shape
        tiles = -(-m // knobs["BLK_M"]) * -(-n // knobs["BLK_N"])
        comm = split_programs(sms, tiles, k_rank, world_size)
    else:
        comm = GPU_COMM_SMS
    return {**knobs, "num_sms": given.get("num_sms", max(1, sms - comm)), "comm_sms": comm}


def few_rows_tile(spec, family, tile, m, n, sms):
    """The tile for an M x N output with few rows: the algorithm's ``gpu_tuning[family + "_few_rows"]``
    ({most rows: tile}) when its usual ``tile`` would leave SMs without a tile (fewer tiles than SMs), else
    ``tile``. With M = 64 and 128 x 256 tiles an 8192-wide C has 32 tiles for 132 SMs."""
    few = spec.gpu_tuning.get(family + "_few_rows")
    if not few or -(-m // tile[0]) * -(-n // tile[1]) >= sms:
        return tile
    return next((few[rows] for rows in sorted(few) if m <= rows), tile)


def split_programs(sms, tiles, k_per_rank, world_size=1):
    """Communication programs, of ``sms`` programs per rank, for ``tiles`` output tiles, a K-slice of
    ``k_per_rank`` and ``world_size`` ranks: enough for the reduction to keep up (COMM_SMS_AT_K2048, scaled
    by 2048 / K_r, by the SMs and by (W + 1) / 2), then as many more as leave the GEMM its number of waves
    (2048 tiles take 16 waves on 128 programs as on 132: those 4 programs cost the GEMM nothing), at most
    max(need, 16), and no more than there are tiles (a communication program reduces whole tiles)."""
    need = -(-COMM_SMS_AT_K2048 * sms * 2048 * (world_size + 1) // (132 * max(k_per_rank, 1) * 2))
    need = max(2, min(need, sms // 2))
    waves = -(-tiles // (sms - need))
    free = sms - -(-tiles // waves)
    return max(1, min(free, max(need, GPU_COMM_SMS), tiles))


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


def _positive_int(name, value, largest):
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name}={value!r} is not an integer: use a whole number from 1 to {largest}")
    if not 1 <= value <= largest:
        raise UsageError(f"{name}={value} is out of range: use a whole number from 1 to {largest}")


# The shortest watchdog: under the interpreter one rank's programs run one after another, so a wait for a
# peer's program can last that long with nothing wrong (0.001 s reported deadlocks that were not).
MIN_TIMEOUT_S = 1.0


@dataclass
class RunConfig:
    """Everything that fixes one fused GEMM + all-reduce run. Names follow Iris's benchmark flags."""

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
    # The dtype of C, and (two_shot) of the partial tiles that travel between ranks. None: the algorithm's
    # choice - atomics and ring sum in C itself, which must be fp32; two_shot sends and returns the input dtype.
    out_dtype: str = None
    wire_dtype: str = None
    # A straggler for stress tests: before each launch, rank delay_rank waits a random 0.5..1 x delay_us (seeded).
    delay_rank: int = -1
    delay_us: float = 0.0
    # cpu only: record every heap access and report races and out-of-bounds accesses (gemmar/sanitizer).
    sanitize: bool = False

    @classmethod
    def from_settings(cls, settings, **fixed):
        """A validated RunConfig from keyword settings; an unknown name is a one-line UsageError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise UsageError(f"setting {unknown[0]!r} is not known: use RunConfig's names "
                             f"({', '.join(sorted(known))})")
        return cls(**{**settings, **fixed}).validate()

    def validate(self):
        """Raise UsageError (one line) for the first bad value; return self."""
        for name in ("m", "n", "k"):
            _positive_int(name, getattr(self, name), MAX_DIM)
        self.datatype = dtype_name(self.datatype)
        spec = self.spec
        for name in ("BLK_M", "BLK_N", "BLK_K"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not MIN_BLOCK <= value <= MAX_BLOCK or \
                    value & (value - 1):
                raise UsageError(f"{name}={value!r} is not allowed: use a power of two from {MIN_BLOCK} to "
                                 f"{MAX_BLOCK} ({', '.join(str(1 << i) for i in range(MIN_BLOCK.bit_length() - 1, MAX_BLOCK.bit_length()))})")
        for name in ("trace", "sanitize"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name}={getattr(self, name)!r} is not allowed: use True or False")
        _positive_int("gsize_m", self.gsize_m, MAX_PROGRAMS)
        _positive_int("num_sms", self.num_sms, MAX_PROGRAMS)
        _positive_int("world_size", self.world_size, MAX_WORLD_SIZE)
        if spec.comm_programs:
            _positive_int("comm_sms", self.comm_sms, MAX_PROGRAMS)
        for name in ("out_dtype", "wire_dtype"):
            if getattr(self, name) is not None:
                setattr(self, name, dtype_name(getattr(self, name)))
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
        if isinstance(self.timeout_s, bool) or not (isinstance(self.timeout_s, (int, float)) and
                                                    MIN_TIMEOUT_S <= self.timeout_s <= 86400):
            raise UsageError(f"timeout_s={self.timeout_s!r} is not allowed: use seconds from {MIN_TIMEOUT_S:g} to "
                             f"86400 (a shorter wait is no sign of a hang)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63:
            raise UsageError(f"seed={self.seed!r} is not allowed: use a whole number from 0 to 2**63 - 1")
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

    def to_dict(self):
        return asdict(self)
