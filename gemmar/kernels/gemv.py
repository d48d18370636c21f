"""Few rows at world size 1 (a decode step's GEMV, M <= 16): one program per column block and K share, not
persistent, so that more programs than SMs keep B's reads in flight.

At M = 1 the GEMM reads B (K x N) once and does almost no arithmetic: its time is how fast B streams in. The
persistent tile GEMM gives each SM one program and one column block: at 1 x 8192 x 2048 with 64-wide blocks,
128 programs each reading a 2048 x 64 strip step by step, well short of torch.matmul's speed (docs/decisions.md,
the few-rows kernel). Here every column block's K is cut into ``split_k`` shares, one program each, as many
programs as that makes: the GPU's scheduler puts several on an SM where their registers and shared memory fit,
and no program loops over tiles.

A share's product is computed as the persistent GEMM computes a tile's (``gemm.gemm_tile_steps``, a 16-row
``tl.dot``), or, with ``BY_DOT`` off and one row (M = 1), as a multiply-add of A's K values into B's block (no
tensor core: at one row a 16-row dot wastes 15 of its 16 rows). With one share a program writes its block of C.
With more, each share stores its fp32 product in a slot of its own and counts in (``slices_in``, release-acquire);
the program that counts in last sums the block's shares in share order (the same bits every run, whoever is
last), writes C and sets the count back to 0 for the next launch. Nobody waits, so nothing can hang.
"""

import triton
import triton.language as tl

from .events import event, finish_trace, stamp
from .gemm import GEMM, gemm_tile_steps, tile_offsets
from .owner_reduce import BROADCAST, REDUCE, TAKE, slot_pointers
from .two_shot import PUBLISH, rounded_as_one_partial, write_alone_tile


@triton.jit
def row_gemv_steps(A, B, N, K, stride_ak, stride_bk, stride_bn, pid_n, first_step, end_step,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Row 0 of A times B's columns ``pid_n * BLOCK_N ..`` over K steps ``first_step .. end_step - 1``, in fp32,
    as a 1 x BLOCK_N block: each step multiplies BLOCK_K values of A into a BLOCK_K x BLOCK_N block of B and
    adds the products element by element; the sum over K happens once, at the end."""
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    first_k = tl.cast(first_step, tl.int64) * BLOCK_K
    a_ptrs = A + (first_k + rk) * stride_ak
    b_ptrs = B + first_k * stride_bk + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    products = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k0 in range(first_step, end_step):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=rk < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        products += a.to(tl.float32)[:, None] * b.to(tl.float32)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return tl.sum(products, axis=0)[None, :]


@triton.jit
def one_rank_gemv(
        # this rank's A and B (all of K); the output, the partials (for their dtype); the shares' fp32 products
        # and a count per column block
        A, B, C, partials, slices, slices_in,
        # the GEMM's shape and strides, and into how many shares each column block's K is cut
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, split_k,
        # this kernel's region of the trace buffer
        trace, trace_counts,
        # the block (BLOCK_M rows: all of M), how a share's product is computed
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
        TRACE_CAPACITY: tl.constexpr, EVEN_K: tl.constexpr, BY_DOT: tl.constexpr):
    """Program ``pid``: column block ``pid // split_k``, K share ``pid % split_k`` (a block's shares are
    neighbours in launch order, so they run at the same time and the last one's sum waits for nobody)."""
    pid = tl.program_id(0)
    pid_n = pid // split_k
    share = pid % split_k
    steps = tl.cdiv(K, BLOCK_K)
    first_step = share * steps // split_k
    end_step = (share + 1) * steps // split_k
    n_events = tl.zeros((), tl.int32)
    t = stamp(TRACE_CAPACITY)
    if BY_DOT:
        acc = gemm_tile_steps(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, 0, pid_n, first_step,
                              end_step, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, EVEN_K, False)
    else:
        tl.static_assert(BLOCK_M == 1, "the multiply-add path computes one row (M = 1)")
        acc = row_gemv_steps(A, B, N, K, stride_ak, stride_bk, stride_bn, pid_n, first_step, end_step, BLOCK_N,
                             BLOCK_K, EVEN_K)
    n_events, t = event(trace, n_events, t, GEMM, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
    if split_k == 1:
        n_events, t = write_alone_tile(acc, C, partials, M, N, stride_cm, stride_cn, trace, n_events, t, pid_n, 0, pid_n,
                                       BLOCK_M, BLOCK_N, TRACE_CAPACITY)
    else:
        tl.store(slot_pointers(slices, pid, BLOCK_M, BLOCK_N), acc)
        # Every thread's store before the count (the block barrier); the count releases them to the program that
        # counts in last, which acquires them with its own add.
        tl.debug_barrier()
        arrived = tl.atomic_add(slices_in + pid_n, 1, sem="acq_rel", scope="gpu")
        n_events, t = event(trace, n_events, t, PUBLISH, pid_n, 0, pid_n, share, 0, TRACE_CAPACITY)
        if arrived == split_k - 1:
            n_events, t = event(trace, n_events, t, TAKE, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for part in range(0, split_k):
                # .cg: from L2, where the other programs' stores are, never a stale line of this SM's L1
                total += tl.load(slot_pointers(slices, pid_n * split_k + part, BLOCK_M, BLOCK_N),
                                 cache_modifier=".cg")
            offsets, mask = tile_offsets(0, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
            # (rounded as write_alone_tile rounds a whole tile: one C, one rounding)
            tl.store(C + offsets, rounded_as_one_partial(total, partials).to(C.dtype.element_ty), mask=mask)
            tl.store(slices_in + pid_n, 0)
            # (summed and written at once: the reduce event covers both, the broadcast is its end)
            n_events, t = event(trace, n_events, t, REDUCE, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
            n_events, t = event(trace, n_events, t, BROADCAST, pid_n, 0, pid_n, share, -1, TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)

