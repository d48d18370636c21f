"""GPU tuning: the settings a run takes on a GPU for every knob the user did not set (tiles per GPU family and
per algorithm, programs per SM, the split between GEMM and communication programs, the few-rows tiles),
from measured figures (docs/decisions.md). On the cpu backend a run takes RunConfig's own defaults."""

from .config import DTYPES, MAX_SPLIT_K, SPLIT_K_ALGORITHMS, RunConfig, dtype_name, k_bounds, waves
from .errors import UsageError

# Per-GPU starting points: (BLK_M, BLK_N, BLK_K, num_warps, num_stages, gsize_m). An algorithm's spec may
# give its own (AlgorithmSpec.gpu_tuning, measured: docs/decisions.md); these are for the others.
GPU_TUNING = {"hopper": (128, 128, 64, 8, 4, 8), "default": (128, 128, 32, 4, 3, 8)}
# Communication programs on GPUs, for an algorithm that has them (the rest of the SMs run the GEMM), when
# the problem's shape is not known; with it, split_programs chooses.
GPU_COMM_SMS = 16
# Communication programs the reduction needs to keep up with the GEMM at K_r = 2048 (fewer cannot keep up, more
# take SMs from the GEMM); the need scales with 1 / K_r and with (W + 1) / 2 (docs/decisions.md, COMM_SMS_AT_K2048).
COMM_SMS_AT_K2048 = 16
# Up to this many rows per rank a GEMM is "few rows": its tile comes from the algorithm's few-rows table
# (few_rows_tile) when its usual tile leaves SMs idle, and at world size 1 it reads A and B through plain pointers
# (launch.gemm_operands). Chosen from measured few-rows shapes (docs/decisions.md, FEW_ROWS).
FEW_ROWS = 512
# Split-K (two_shot and one_shot at world size 1): cut the K of each tile of the last wave into slices when that
# wave fills at most 1 / SPLIT_WHEN_FILLS of the SMs and at most SPLIT_MAX_WHOLE_WAVES waves come before it, as
# many slices as fill them, each at least SPLIT_MIN_STEPS steps of BLK_K and SPLIT_K_PER_ROW x BLK_M of K (a
# shorter one costs more in its fp32 slot's trip through memory than it saves: a slot is 8 x BLK_M x BLK_N bytes
# written and read, against the 2 x K x BLK_N bytes of B the slice reads). Chosen on the shape sweep's split grid
# (docs/decisions.md, split-K).
SPLIT_WHEN_FILLS = 2
SPLIT_FILL_EVERY_PROGRAM = False   # True: ceil(SMs / last wave) slices, so the shares cross tiles (stream-K)
SPLIT_MIN_STEPS = 4
SPLIT_K_PER_ROW = 6
SPLIT_MAX_WHOLE_WAVES = 2
# The few-rows kernel (two_shot.one_rank_gemv, RunConfig.gemv): two_shot and one_shot at world size 1 on Hopper, with a GPU
# per rank, up to GEMV_ROWS rows and no tuning cache entry for the shape. Its tile by rows (gemv_tile) and its K
# slices (gemv_split): as many slices (a power of two) as keep every program resident at once - one a SM by dot
# (its 3-4 stages of a 64-wide tile fill an SM's shared memory), GEMV_ROW_PROGRAMS_PER_SM at one row (multiply-add,
# 2 stages) - each at least GEMV_MIN_STEPS steps of BLK_K. Measured: docs/decisions.md, the few-rows kernel.
GEMV_ROWS = 64
GEMV_ROW_PROGRAMS_PER_SM = 3
GEMV_MIN_STEPS = 4
GEMV_SOURCE = ("the few-rows kernel's rule (tuning.gemv_tile: one program per column tile and K slice, "
               "two_shot.one_rank_gemv)")
TUNED_KNOBS = ("BLK_M", "BLK_N", "BLK_K", "num_warps", "num_stages", "gsize_m", "num_sms", "comm_sms", "split_k",
               "gemv")


def reads_by_tma(n, k, world_size, datatype):
    """Whether every rank's GEMM can read A and B through Hopper's tensor descriptors (``launch.gemm_operands``):
    16-bit values, and rows of B (N values) and of each rank's K-slice of A a multiple of 16 bytes."""
    if DTYPES[dtype_name(datatype)].itemsize != 2 or n % 8:
        return False
    return all((end - start) % 8 == 0 and end > start for start, end in (k_bounds(k, world_size, r)
                                                                         for r in range(world_size)))


def tuned_defaults(backend, algorithm, capability=(0, 0), multiprocessors=0, shape=None, given=None, trace=False,
                   tma=True, shared=False, gpu=None, datatype=None):
    """Settings that suit the device, for every knob the user did not set (``given``: the ones they did).
    On the cpu backend these are RunConfig's own defaults; on GPUs the algorithm's tile for the GPU's family
    and one program per SM, split between the GEMM and the communication programs by ``split_programs``
    when the problem's ``shape`` (M, N, K per rank, world size) is known. ``tma``: whether the GEMM will
    read through tensor descriptors (:func:`reads_by_tma`); ``shared``: the ranks share one GPU. With the GPU's
    name (``gpu``) and the ``datatype`` too, the tile is :func:`tile_choice`'s (the tuning cache, then the fitted
    rule)."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if given.get("gemv"):
        for knob in ("num_sms", "comm_sms"):
            if knob in given:
                raise UsageError(f"{knob}={given[knob]} is not allowed with gemv=True: the few-rows kernel runs one "
                                 f"program per column tile and K slice (set BLK_N and split_k), and no communication "
                                 f"programs")
    if backend == "cpu":
        defaults = RunConfig()
        return {knob: given.get(knob, getattr(defaults, knob)) for knob in TUNED_KNOBS}
    from .algorithms import get

    spec = get(algorithm)
    family = "hopper" if tuple(capability) >= (9, 0) else "default"
    tile = {**GPU_TUNING, **spec.gpu_tuning}[family]
    if shape is not None and (shape[3] == 1 or not shared):
        # At world size 1 (two_shot's launch is then the GEMM alone) and with a GPU per rank, where they were
        # measured faster (docs/decisions.md, few-rows tiles). Not for ranks sharing a GPU: unmeasured, and there
        # every rank's programs must fit on it at once.
        tile = few_rows_tile(spec, family, tile, shape[0], shape[1], multiprocessors or 108)
    # The few-rows kernel where the rule or the cache picks it, unless the user said --no-gemv, or set what it does
    # not take (the programs), or a tile too short for all of M.
    may_gemv = given.get("gemv", True) and not {"num_sms", "comm_sms"} & set(given) and \
        (shape is None or given.get("BLK_M", shape[0]) >= shape[0])
    chosen, _, gemv = tile_choice(algorithm, family, shape, gpu, datatype, shared, gemv=may_gemv,
                                  sms=given.get("num_sms") or multiprocessors or 108)
    tile = chosen or tile
    gemv = given.get("gemv", gemv)   # (--gemv over the choice)
    knobs = {**dict(zip(TUNED_KNOBS[:6], tile)), **given, "gemv": gemv}
    if gemv:   # (one program per column tile and K slice: RunConfig.validate counts them into num_sms)
        split = given.get("split_k") or (1 if shape is None else
                                         gemv_split(shape, knobs["BLK_N"], knobs["BLK_K"], multiprocessors or 108))
        return {**knobs, "num_sms": multiprocessors or 108, "comm_sms": 1, "split_k": split}
    sms = multiprocessors or 108
    if not spec.comm_programs:
        comm = 0
    elif "comm_sms" in given:
        comm = given["comm_sms"]
    elif family == "hopper" and spec.comm_beside_gemm and tma and not (trace or given.get("trace")):
        # One communication program beside each GEMM program, on its SM (launch.share_sms): the GEMM keeps
        # every SM (measured faster: docs/decisions.md, communication beside the GEMM). Not when traced, nor
        # when the GEMM reads through plain pointers: the pair then needs more registers than an SM has.
        comm = None
    elif shape is not None:
        m, n, k_rank, world_size = shape
        tiles = -(-m // knobs["BLK_M"]) * -(-n // knobs["BLK_N"])
        comm = split_programs(sms, tiles, k_rank, world_size)
    else:
        comm = GPU_COMM_SMS
    gemm = given.get("num_sms", sms if comm is None else max(1, sms - comm))
    knobs = {**knobs, "num_sms": gemm, "comm_sms": gemm if comm is None else comm}
    if "split_k" not in given:
        # (for the programs the GEMM has: with communication programs on SMs of their own, fewer than the SMs)
        knobs["split_k"] = 1 if shape is None or shared else split_k_rule(
            algorithm, shape, (knobs["BLK_M"], knobs["BLK_N"], knobs["BLK_K"]), gemm)
    return knobs


def tile_choice(algorithm, family, shape, gpu, datatype, shared=False, gemv=True, sms=None):
    """(tile, where it came from, whether it runs the few-rows kernel) for a run whose knobs are not given, or
    (None, why, False) where the algorithm's own tile stands: the tuning cache's entry for this GPU, dtype, world
    size and per-rank shape (``tuning_cache.choose``), wherever one exists; else, for two_shot and one_shot at
    world size 1 on Hopper, the few-rows kernel up to GEMV_ROWS rows (:func:`gemv_tile`), then the rule fitted
    on the shape sweep (``tuning_cache.RULE``, while it is not empty); else the algorithm's measured tiles (its
    ``gpu_tuning``, with the few-rows tiles of :func:`few_rows_tile`). ``gemv`` False: never the few-rows kernel's
    rule (the user's --no-gemv, or knobs it does not take). ``sms``: the GPU's, for the rule's wave model."""
    measured = f"the algorithm's measured tile ({algorithm}'s gpu_tuning and few-rows tiles: docs/decisions.md)"
    if shape is None or not gpu or not datatype or shared:
        return None, measured, False
    from . import tuning_cache

    choice = tuning_cache.choose(gpu, datatype, shape[3], tuple(shape[:3]), algorithm, sms=sms)
    few_rows = gemv_tile(algorithm, family, shape) if gemv else None
    if few_rows and not (choice is not None and choice.cached):
        return few_rows, GEMV_SOURCE, True
    if choice is not None and (choice.cached or (shape[3] == 1 and family == "hopper" and
                                                 algorithm in tuning_cache.TILED)):
        return tuple(choice.tile[k] for k in tuning_cache.TILE_KNOBS), choice.source, choice.gemv and gemv
    return None, measured + ("" if tuning_cache.RULE else "; no cache entry for this GPU, dtype, world size and "
                                                            "shape, and no fitted rule yet"), False


def gemv_tile(algorithm, family, shape):
    """The few-rows kernel's tile (TILE_KNOBS order) for ``shape`` (M, N, K per rank, world size), or None where it
    does not run: all of M in one tile row, 64 columns; at one row 128 of K a step at 2 stages (a multiply-add:
    BLK_M only pads the slots), up to 16 rows 256 of K at 3 stages (128 where K < 1024), up to 64 rows 128 of K
    at 4 stages; 4 warps. Read off the measured blocks at issue 60's shapes with M <= 64 (docs/decisions.md, the
    few-rows kernel)."""
    m, _, k_rank, world_size = shape
    if world_size != 1 or algorithm not in SPLIT_K_ALGORITHMS or family != "hopper" or m > GEMV_ROWS:
        return None
    if m == 1:
        return (16, 64, 128, 4, 2, 1)
    if m <= 16:
        return (16, 64, 256 if k_rank >= 1024 else 128, 4, 3, 1)
    return (max(16, 1 << (m - 1).bit_length()), 64, 128, 4, 4, 1)


def gemv_split(shape, blk_n, blk_k, sms, per_sm=None):
    """K slices per column tile for the few-rows kernel (see GEMV_ROWS): the most, a power of two, that keep
    every program resident at once (``per_sm`` programs an SM: by default GEMV_ROW_PROGRAMS_PER_SM at one row, the
    multiply-add, else one, the dot's) and give each at least GEMV_MIN_STEPS steps of ``blk_k``."""
    m, n, k_rank, _ = shape
    tiles, steps = -(-n // blk_n), -(-k_rank // blk_k)
    room = sms * (per_sm or (GEMV_ROW_PROGRAMS_PER_SM if m == 1 else 1))
    split = 1
    while tiles * split * 2 <= room and steps // (split * 2) >= GEMV_MIN_STEPS and split * 2 <= MAX_SPLIT_K:
        split *= 2
    return split


def few_rows_tile(spec, family, tile, m, n, sms):
    """The tile for an M x N output with few rows: the algorithm's ``gpu_tuning[family + "_few_rows"]``
    ({most rows: tile}) when its usual ``tile`` would leave SMs without a tile (fewer tiles than SMs), else
    ``tile``. With M = 64 and 128 x 256 tiles an 8192-wide C has 32 tiles for 132 SMs."""
    few = spec.gpu_tuning.get(family + "_few_rows")
    if not few or -(-m // tile[0]) * -(-n // tile[1]) >= sms:
        return tile
    return next((few[rows] for rows in sorted(few) if m <= rows), tile)


def split_k_rule(algorithm, shape, blocks, sms, min_steps=SPLIT_MIN_STEPS, max_whole_waves=SPLIT_MAX_WHOLE_WAVES,
                 k_per_row=SPLIT_K_PER_ROW, when_fills=SPLIT_WHEN_FILLS, fill_every_program=SPLIT_FILL_EVERY_PROGRAM):
    """Slices per last-wave tile (RunConfig.split_k) for ``shape`` (M, N, K per rank, world size) with ``blocks``
    (BLK_M, BLK_N, BLK_K) on ``sms`` programs: 1 unless the algorithm splits K at this world size and the
    tiles of the last wave (all of them, when there are no more tiles than programs) fill at most
    1 / SPLIT_WHEN_FILLS of the programs, after at most ``max_whole_waves`` whole waves; then as many slices as fill
    them (``fill_every_program``: enough to give every program a share, which then crosses tiles: stream-K), each
    of at least ``min_steps`` steps of BLK_K and ``k_per_row`` x BLK_M of K (the shape sweep evaluates others)."""
    m, n, k_rank, world_size = shape
    if world_size != 1 or algorithm not in SPLIT_K_ALGORITHMS:
        return 1
    tiles = -(-m // blocks[0]) * -(-n // blocks[1])
    whole, last_wave = waves(tiles, sms)
    if last_wave * when_fills > sms or whole // sms > max_whole_waves:
        return 1
    fill = -(-sms // last_wave) if fill_every_program else sms // last_wave
    by_rows = k_rank // (k_per_row * blocks[0]) if k_per_row else MAX_SPLIT_K
    return max(1, min(fill, -(-k_rank // blocks[2]) // min_steps, by_rows, MAX_SPLIT_K))


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
