"""The few-rows kernel's one-row product: what ``two_shot.one_rank_gemv`` (two_shot and one_shot at world size 1
with ``RunConfig.gemv``, up to 64 rows: a decode step's GEMV) computes a share with at M = 1. The kernel itself
lives beside two_shot's other world-size-1 kernels, whose way of writing C it shares.

The few-rows kernel: one program per column block and K share, not persistent, so that more programs than SMs
keep B's reads in flight.

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
