"""A persistent GEMM: the building block every fused GEMM + all-reduce kernel shares.

The output C (M x N) is cut into BLOCK_M x BLOCK_N tiles, numbered 0 .. total_tiles-1. Instead of one
program per tile, a *persistent* kernel starts a fixed number of programs (``NUM_SMS``, one per
multiprocessor on a GPU) and each loops over tiles ``pid, pid + NUM_SMS, pid + 2*NUM_SMS, ...``: every
tile is done exactly once, by program ``tile_id % NUM_SMS``, whatever the tile count.

Tile ids are mapped to (pid_m, pid_n) with a ``GROUP_SIZE_M`` swizzle: consecutive ids walk down a column
of GROUP_SIZE_M tile-rows before moving right, so programs that run at the same time reuse the same
columns of B from cache. The last group may be shorter than GROUP_SIZE_M; it is clamped, never skipped.

A and B reach ``gemm_tile`` in one of two forms, chosen once by the launcher (``runtime/launch.py``):
plain pointers (the interpreter, and any shape a tensor descriptor cannot describe), or, when ``TMA`` is
set, Hopper tensor descriptors: the tensor-memory accelerator then copies whole tiles into shared memory
by itself, zero-filling past the edges, which is what lets the compiled GEMM keep up with cuBLAS.
"""

import triton
import triton.language as tl

from .device import INTERPRETER
from .events import event, finish_trace, stamp
from .spec import Part, Phase
from .puzzle_parts import tile_coords   # (a puzzle's answer: see puzzle_parts.py)

# The phases every algorithm shares: a tile's GEMM, and storing a tile (C, or whatever the algorithm stores).
GEMM_PHASE, STORE_PHASE = Phase(1, "gemm", "gemm"), Phase(7, "store", "store")
GEMM, STORE = tl.constexpr(GEMM_PHASE.kind_id), tl.constexpr(STORE_PHASE.kind_id)


TILE_COORDS_PART = Part(tile_coords, "(pid_m, pid_n)")   # notebook 1's puzzle, in every kernel that takes TILE_COORDS


@triton.jit
def gemm_tile(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr):
    """One output tile of this rank's partial product, accumulated in fp32: the whole of K."""
    return gemm_tile_steps(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n, 0,
                           tl.cdiv(K, BLOCK_K), BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, EVEN_K, TMA)


@triton.jit
def gemm_tile_steps(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n, first_step, end_step,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr):
    """The tile's product over K steps ``first_step .. end_step - 1`` (a step is BLOCK_K of K): all of them for
    :func:`gemm_tile`, one slice of them for a split-K tile (``two_shot.one_rank_split_gemm``).

    With ``TMA``, A and B are tensor descriptors: each load names the tile's corner and the hardware
    fetches the block, with zeros past M, N and K. Otherwise they are pointers: rows and columns past M
    and N read row/column 0 again (the ``% M``): cheaper than masking every load, and those values are
    never stored. The K edge is masked to zero so it adds nothing; when BLOCK_K divides K (``EVEN_K``)
    the loads carry no mask at all, which lets the compiler pipeline them.
    """
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        for k0 in range(first_step, end_step):
            a = A.load([pid_m * BLOCK_M, k0 * BLOCK_K])
            b = B.load([k0 * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    else:
        rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        rk = tl.arange(0, BLOCK_K)
        # (a slice's first row of B, first_step * BLOCK_K * N elements in, can pass 2**31: moved to in 64 bits; at the
        # first step, 0, the compiler drops the move)
        first_k = tl.cast(first_step, tl.int64) * BLOCK_K
        a_ptrs = A + first_k * stride_ak + rm[:, None] * stride_am + rk[None, :] * stride_ak
        b_ptrs = B + first_k * stride_bk + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        for k0 in range(first_step, end_step):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                k_left = K - k0 * BLOCK_K
                a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
                b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
            if INTERPRETER:
                # The interpreter's tl.dot reads bf16 as raw bits (Triton 3.6-3.9); fp32 is exact for the
                # product of two fp16/bf16 values, so widening first changes nothing else.
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def traced_gemm_tile(gemm, tile_id, trace, n_events, TILE_COORDS: tl.constexpr,
                     # how the GEMM is tiled and computed, and the trace's capacity
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                     DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr,
                     TRACE_CAPACITY: tl.constexpr):
    """The step every kernel starts a tile with: where the tile is, its partial product, and a ``gemm``
    trace event. Returns (acc, pid_m, pid_n, n_events, t): ``t``, the GEMM's end, starts the next phase.

    A kernel names its GEMM's operands once, ``gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk,
    stride_bn)``, and passes them on whole; the tiling stays separate constexpr arguments (a tuple of constexprs
    is one constexpr in Triton 3.9, but Triton 3.6's interpreter refuses it). ``TILE_COORDS`` is the tile-id ->
    (pid_m, pid_n) function: :func:`tile_coords`, or a participant's own (notebook 1's puzzle, through the
    kernels' ``TILE_COORDS`` argument)."""
    A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn = gemm
    pid_m, pid_n = TILE_COORDS(tile_id, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_SIZE_M)
    # (A float here failed deep in the address arithmetic below, in Triton's words, with no line of the part.)
    tl.static_assert(pid_m.dtype.is_int(), "TILE_COORDS returned a pid_m that is not a whole number")
    tl.static_assert(pid_n.dtype.is_int(), "TILE_COORDS returned a pid_n that is not a whole number")
    t = stamp(TRACE_CAPACITY)
    acc = gemm_tile(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
                    BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, EVEN_K, TMA)
    n_events, t = event(trace, n_events, t, GEMM, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    return acc, pid_m, pid_n, n_events, t


@triton.jit
def tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets of a tile in an M x N matrix, and the mask of the ones inside it."""
    return tile_rows_offsets(pid_m, pid_n, 0, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_M, BLOCK_N)


@triton.jit
def tile_rows_offsets(pid_m, pid_n, first, M, N, stride_cm, stride_cn, ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """The same for rows ``first`` .. ``first + ROWS - 1`` of the tile only."""
    rm = pid_m * BLOCK_M + first + tl.arange(0, ROWS)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    return offsets, mask


@triton.jit
def persistent_gemm(
        # the inputs and the output
        A, B, C,
        # the GEMM's shape and strides
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        # the trace buffer
        trace, trace_counts,
        # the GEMM's tiles and programs, and how it computes a tile
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr,
        EVEN_K: tl.constexpr = False, TMA: tl.constexpr = False, FLATTEN: tl.constexpr = False):
    """C = A @ B on one rank, no communication: the plain persistent GEMM, traced like the others.

    ``FLATTEN`` lets the compiler merge the tile loop and the K loop into one software pipeline, so the
    loads of the next tile start while the current one is still being stored (compiled only)."""
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NUM_SMS, flatten=FLATTEN):
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, tile_coords, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M,
                                                           DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY)
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        tl.store(C + offsets, acc.to(C.dtype.element_ty), mask=mask)
        n_events, t = event(trace, n_events, t, STORE, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)
