"""Iris's fused GEMM + all-reduce op, torchrun style: each rank holds a K-slice of A and B,
``shmem.ops.matmul_all_reduce(out, A_r, B_r)`` leaves ``sum over ranks of A_r @ B_r`` on every rank, run back
to back with new values, by each of gemmar's kernels (variants two_shot, one_shot, atomic, ring), checked against
torch in float64; two_shot's and one_shot's results must be the same bits on every rank.

    gemmar run -r 3 examples/iris_today/ops_matmul_all_reduce.py -m 50 -n 70 -k 90 --iterations 3
"""

import argparse

import torch
import torch.distributed as dist

import iris
from iris.ops import FusedConfig


def main():
    parser = argparse.ArgumentParser(description="ops.matmul_all_reduce, back to back, checked")
    parser.add_argument("-m", type=int, default=50)
    parser.add_argument("-n", type=int, default=70)
    parser.add_argument("-k", type=int, default=90, help="K of each rank's slice")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--datatype", default="fp16", choices=["fp16", "bf16", "fp32"])
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")
    shmem = iris.iris(1 << 30)
    rank = shmem.get_rank()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.datatype]
    M, N, K = args.m, args.n, args.k
    A, B = shmem.zeros((M, K), dtype=dtype), shmem.zeros((K, N), dtype=dtype)
    out = shmem.zeros((M, N), dtype=dtype)
    wrong, worst = [], 0.0
    variants = ("two_shot", "one_shot", "atomic", "ring")
    for variant in variants:
        config = FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32, num_sms=3, all_reduce_variant=variant)
        for it in range(args.iterations):
            g = torch.Generator().manual_seed(1000 * it + rank)
            A.copy_(torch.randn(M, K, generator=g).to(dtype))
            B.copy_(torch.randn(K, N, generator=g).to(dtype))
            shmem.ops.matmul_all_reduce(out, A, B, config=config)
            pieces = [(torch.empty(M, K, dtype=dtype), torch.empty(K, N, dtype=dtype))
                      for _ in range(dist.get_world_size())]
            dist.all_gather([p[0] for p in pieces], A.cpu())
            dist.all_gather([p[1] for p in pieces], B.cpu())
            reference = sum(a.double() @ b.double() for a, b in pieces)
            error = (out.cpu().double() - reference).abs().max().item()
            worst = max(worst, error / reference.abs().max().item())
            if error > 2e-2 * reference.abs().max().item():
                wrong.append(f"{variant} iteration {it}: max error {error:.3g}")
            outs = [torch.empty(M, N, dtype=dtype) for _ in range(dist.get_world_size())]
            dist.all_gather(outs, out.cpu())
            if variant in ("two_shot", "one_shot") and any(not torch.equal(o, outs[0]) for o in outs):
                wrong.append(f"{variant} iteration {it}: ranks hold different bits")
    shmem.barrier()
    shmem.info(f"matmul_all_reduce {M} x {N} x {K} per rank, {len(variants)} kernels x {args.iterations} launches: "
               f"{'all right' if not wrong else 'WRONG: ' + '; '.join(wrong)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
