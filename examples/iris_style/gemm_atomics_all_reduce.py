"""GEMM + all-reduce by remote atomics, in Iris's example style (a persistent GEMM whose programs add each
partial tile into every rank's C with iris.atomic_add), checked against torch.

Every rank builds the same A (M x K) and B (K x N) from one seed and keeps its K-slice; each tile of its
partial product is added, element by element, into C on every rank, so that after a barrier every rank
holds A @ B.

    gemmar run -r 3 examples/iris_style/gemm_atomics_all_reduce.py -m 64 -n 96 -k 120 --validate
"""

import argparse

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def persistent_gemm_all_reduce(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                               BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                               NUM_SMS: tl.constexpr, cur_rank, world_size, heap_bases):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_SIZE_N)
    total_tiles = tl.cdiv(M, BLOCK_SIZE_M) * tiles_n
    for tile in range(pid, total_tiles, NUM_SMS):
        rm = (tile // tiles_n) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        rn = (tile % tiles_n) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_SIZE_K):
            rk = k0 + tl.arange(0, BLOCK_SIZE_K)
            a = tl.load(A + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            b = tl.load(B + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        c_ptrs = C + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        c_mask = (rm[:, None] < M) & (rn[None, :] < N)
        for target in range(world_size):
            iris.atomic_add(c_ptrs, acc, cur_rank, target, heap_bases, mask=c_mask, sem="relaxed", scope="sys")


def main():
    parser = argparse.ArgumentParser(description="GEMM + all-reduce by remote atomics")
    parser.add_argument("-m", type=int, default=256, help="rows of A and C")
    parser.add_argument("-n", type=int, default=256, help="columns of B and C")
    parser.add_argument("-k", type=int, default=512, help="the reduced dimension, split over the ranks")
    parser.add_argument("--BLK_M", type=int, default=32)
    parser.add_argument("--BLK_N", type=int, default=32)
    parser.add_argument("--BLK_K", type=int, default=32)
    parser.add_argument("--gemm_sms", type=int, default=4, help="persistent programs")
    parser.add_argument("-v", "--validate", action="store_true", help="check C on every rank")
    parser.add_argument("-p", "--heap_size", type=int, default=1 << 33, help="Iris heap size")
    args = parser.parse_args()

    shmem = iris.iris(args.heap_size)
    rank, world_size = shmem.get_rank(), shmem.get_num_ranks()
    torch.manual_seed(0)
    A = torch.randn(args.m, args.k, device="cuda", dtype=torch.float16)
    B = torch.randn(args.k, args.n, device="cuda", dtype=torch.float16)
    per_rank = args.k // world_size
    if per_rank * world_size != args.k:
        raise ValueError(f"k={args.k} must be a multiple of the {world_size} ranks")
    local_A = A[:, rank * per_rank:(rank + 1) * per_rank]
    local_B = B[rank * per_rank:(rank + 1) * per_rank, :]
    C = shmem.zeros(args.m, args.n, device="cuda", dtype=torch.float32)
    shmem.barrier()

    persistent_gemm_all_reduce[(args.gemm_sms,)](
        local_A, local_B, C, args.m, args.n, per_rank, local_A.stride(0), local_A.stride(1), local_B.stride(0),
        local_B.stride(1), C.stride(0), C.stride(1), args.BLK_M, args.BLK_N, args.BLK_K, args.gemm_sms, rank,
        world_size, shmem.get_heap_bases(), num_warps=4, num_stages=2, waves_per_eu=0, matrix_instr_nonkdim=16,
        kpack=2)
    shmem.barrier()

    if args.validate:
        expected = A.float() @ B.float()
        diff = (C - expected).abs().max().item()
        ok = torch.allclose(C, expected, atol=1e-2 * (args.k ** 0.5), rtol=1e-3)
        shmem.log(f"{'Validation passed' if ok else 'Validation failed'}: C is {args.m} x {args.n}, max|C - A @ B| "
                  f"{'within' if ok else 'beyond'} the tolerance")
        if not ok:
            shmem.log(f"max|C - A @ B| = {diff:.3g}")
            raise SystemExit(1)
    shmem.barrier()


if __name__ == "__main__":
    main()
