"""Iris's fused GEMM ops (iris.ops: matmul_all_reduce, all_gather_matmul, matmul_all_gather) in bf16 against
torch, and, where a result is wrong, whether it is the GEMM of the bf16 bit patterns taken as integers.

    gemmar run -r 2 --iris IRIS_CHECKOUT examples/iris_real/bf16_matmul.py [--dtype bf16]

(Iris's ops import tritonBLAS: put its include folder on PYTHONPATH.) Under Triton's interpreter (3.9.0 and
earlier) a bf16 value is kept as its uint16 bits and ``tl.dot`` converts only 8-bit float operands before its
``np.matmul``, so a bf16 GEMM multiplies the bit patterns: ~1e10 where torch has ~10 (triton-lang/triton#11584).
This is why Iris's tests/ops fail in bf16 on cpu ranks (18 cases) while fp16 and fp32 pass; a compiled kernel
takes bf16 operands as their values. Exit 1 when an op is wrong on some rank.
"""

import argparse
import os

import torch
import torch.distributed as dist

import iris
from iris.ops.config import FusedConfig

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def as_values(x):
    return x.to(torch.float64).cpu()


def as_bits(x):
    """The bf16 (or fp16) elements' 16 bits read as unsigned integers, what the interpreter's tl.dot multiplies."""
    return (x.cpu().view(torch.int16).to(torch.int64) & 0xFFFF).to(torch.float64)


def gather_rows(x, world):
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=0)


def gather_columns(x, world):
    return gather_rows(x.t().contiguous(), world).t()


def summed(x):
    x = x.clone()
    dist.all_reduce(x)
    return x


def near(got, want, relative):
    return (got - want).abs().max().item() <= relative * want.abs().max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("-m", type=int, default=64)
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("-k", type=int, default=32, help="K of each rank's part")
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="gloo")
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    dtype, m, n, k = DTYPES[args.dtype], args.m, args.n, args.k
    config = FusedConfig(block_size_m=32, block_size_n=32, block_size_k=32)
    mine = torch.Generator().manual_seed(rank)
    shared = torch.Generator().manual_seed(100)
    a_mine = torch.randn(m, k, generator=mine).to(dtype)            # this rank's A (or its K columns of A)
    b_part = torch.randn(k, n, generator=shared).to(dtype)          # the same B on every rank (K = k)
    b_full = torch.randn(k * world, n, generator=shared).to(dtype)  # the same B on every rank (K = k * world)

    def heap_copy(x):
        y = ctx.zeros(tuple(x.shape), dtype=dtype)
        y.copy_(x)
        return y

    def on_values_and_on_bits(model):
        return model(as_values), (model(as_bits) if dtype != torch.float32 else None)

    ops = []   # (name, C, (expected, expected if the GEMM multiplied bit patterns))
    c = ctx.zeros((m, n), dtype=dtype)
    a, b = heap_copy(a_mine), heap_copy(b_part)
    ctx.barrier()
    ctx.ops.matmul_all_reduce(c, a, b, config=config)
    ops.append(("matmul_all_reduce", c, on_values_and_on_bits(lambda v: summed(v(a_mine) @ v(b_part)))))

    c = ctx.zeros((m, n), dtype=dtype)
    a, b = heap_copy(a_mine), heap_copy(b_full)
    ctx.barrier()
    ctx.ops.all_gather_matmul(c, a, b, config=config)
    ops.append(("all_gather_matmul", c, on_values_and_on_bits(lambda v: gather_columns(v(a_mine), world) @ v(b_full))))

    c = ctx.zeros((m * world, n), dtype=dtype)
    a, b = heap_copy(a_mine), heap_copy(b_part)
    ctx.barrier()
    ctx.ops.matmul_all_gather(c, a, b, config=config)
    ops.append(("matmul_all_gather", c, on_values_and_on_bits(lambda v: gather_rows(v(a_mine) @ v(b_part), world))))

    torch.cuda.synchronize()
    ctx.barrier()
    wrong = 0
    for name, c, (expected, expected_on_bits) in ops:
        got = as_values(c)
        diff = (got - expected).abs().max().item()
        if near(got, expected, 2e-2):
            verdict = "ok"
        elif expected_on_bits is not None and near(got, expected_on_bits, 2e-2):
            verdict = ("WRONG: it is the GEMM of the inputs' 16-bit patterns taken as integers "
                       "(Triton's interpreter's tl.dot on bf16)")
        else:
            verdict = "WRONG"
        wrong += verdict != "ok"
        print(f"{name:18s} {args.dtype}: max |C - torch| = {diff:.3g}, C[0, 0] = {got[0, 0].item():.4g} "
              f"(torch {expected[0, 0].item():.4g}): {verdict}", flush=True)
    ctx.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
