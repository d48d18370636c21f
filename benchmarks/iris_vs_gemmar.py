"""Iris's own all-reduce against gemmar's, NCCL and torch's symmetric memory, on the same ranks and sizes.

A program for ``gemmar run --iris`` (each rank runs it; the real Iris's ``ccl.all_reduce`` runs its own kernels on
gemmar's heap, gemmar's all-reduce runs on the same heap):

    gemmar run -r 2 --backend cuda --iris IRIS_CHECKOUT benchmarks/iris_vs_gemmar.py [--sizes 1K 1M 256M] [--out F]

Prints, on rank 0, one line per size: each method's time per call (the slowest rank's mean over the timed calls,
after warm-up calls), and writes them as JSON (``--out``). Every method's result is checked against the sum of
the ranks' inputs after its timed calls; a wrong one is printed as WRONG and the program exits 1. NCCL and torch's
symmetric memory need a GPU per rank (the heap's process group is nccl there); ranks that share one GPU measure
the GPU's memory, not links between GPUs, and say so.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import iris
from iris.ccl import Config

from gemmar.iris import this_rank
from gemmar.runtime.allreduce import SymmetricAllReduce

IRIS_VARIANTS = ("two_shot", "one_shot", "ring", "atomic", "spinlock")
ZEROED_OUTPUT = {"atomic", "spinlock"}   # (these add into their output: it starts at zero on every call)
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_bytes(text):
    text = text.upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1:] in UNITS else int(text)


def timed(call, iterations, warmup):
    torch.cuda.synchronize()
    dist.barrier()   # (every rank's buffers are made and zeroed before any rank's first call writes into a peer's)
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    torch.cuda.synchronize()
    mine = torch.tensor([(time.perf_counter() - start) / iterations])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1K", "16K", "256K", "1M", "4M", "16M", "64M", "256M"])
    parser.add_argument("--variants", nargs="+", choices=IRIS_VARIANTS, default=list(IRIS_VARIANTS))
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="gloo")   # (with a GPU per rank, gemmar's heap group: gloo and nccl)
    heap = this_rank.rank_heap()
    ctx = iris.iris(heap_size=heap.size)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    gpu_per_rank = heap.ranks_on_device == 1 and heap.device.type == "cuda"
    dtype = torch.bfloat16
    rows_out, wrong = [], 0
    if rank == 0:
        where = ("a GPU per rank" if gpu_per_rank else "cpu ranks (the Triton interpreter: not a speed)"
                 if heap.device.type == "cpu" else f"{world} ranks sharing one GPU (memory, not links)")
        print(f"{world} rank(s), {where}, {torch.cuda.get_device_name()}, bf16; ms per call (slowest rank)")
    for text in args.sizes:
        nbytes = size_bytes(text)
        numel = max(nbytes // 2, 64)
        shape = (numel // 1024, 1024) if numel >= 1024 else (1, numel)
        numel = shape[0] * shape[1]
        generator = torch.Generator().manual_seed(rank)
        mine = torch.randn(shape, generator=generator).to(dtype)
        expected = mine.to(torch.float32)
        dist.all_reduce(expected)
        tolerance = 0.05 * world
        row = {"bytes": numel * 2, "world_size": world, "gpu_per_rank": gpu_per_rank}
        iterations = max(3, min(args.iterations, int(2e9 // max(numel * 2, 1))))

        def check(name, got):
            nonlocal wrong
            diff = (got.to(torch.float32).cpu() - expected).abs().max().item()
            if diff > tolerance:
                wrong += 1
                row[name + "_wrong"] = diff

        source = ctx.zeros(shape, dtype=dtype)
        result = ctx.zeros(shape, dtype=dtype)
        source.copy_(mine.to(source.device))
        for variant in args.variants:
            config = Config(all_reduce_variant=variant)
            if variant == "ring" and config.block_size_n % world:
                continue
            workspace = ctx.ccl.all_reduce_preamble(result, source, config=config)

            def iris_call():
                if variant in ZEROED_OUTPUT:
                    result.zero_()
                ctx.ccl.all_reduce(result, source, config=config, workspace=workspace)

            row["iris_" + variant] = timed(iris_call, iterations, 2) * 1e3
            check("iris_" + variant, result)
        with heap.allocating_for_program():
            ours = SymmetricAllReduce(heap, numel, dtype)
        ours.prepare()
        ours.input.copy_(mine.to(heap.device).view(-1))
        out = None

        def gemmar_call():
            nonlocal out
            out = ours(ours.input, wait=False)

        row["gemmar"] = timed(gemmar_call, iterations, 2) * 1e3
        ours.check()
        check("gemmar", out.view(shape))
        if gpu_per_rank and heap.device.type == "cuda":
            nccl_buffer = mine.to(heap.device)

            def nccl_call():
                nccl_buffer.copy_(mine_gpu)
                dist.all_reduce(nccl_buffer)

            mine_gpu = mine.to(heap.device)
            row["nccl"] = timed(nccl_call, iterations, 2) * 1e3
            check("nccl", nccl_buffer)
        rows_out.append(row)
        if rank == 0:
            cells = ", ".join(f"{k} {v:.3f}" for k, v in row.items() if isinstance(v, float) and not k.endswith("wrong"))
            bad = [k for k in row if k.endswith("_wrong")]
            print(f"{numel * 2:>11,d} B: {cells}" + (f"  WRONG: {', '.join(bad)}" if bad else ""), flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), world_size=world, gpu_per_rank=gpu_per_rank,
                           rows=rows_out), f, indent=1)
    ctx.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
