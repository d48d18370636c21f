"""Iris's collectives, torchrun style: the program reads ``LOCAL_RANK``, calls ``dist.init_process_group``
itself, and calls ``shmem.ccl.all_reduce`` / ``all_gather`` / ``reduce_scatter`` / ``all_to_all`` back to back
on new values each time, checking every result against a reference built with ``torch.distributed`` (an
``all_gather`` of every rank's input). All-reduce results must also be the same bits on every rank.

    gemmar run -r 3 examples/iris_today/torchrun_ccl.py -m 40 -n 72 --iterations 3
"""

import argparse
import os

import torch
import torch.distributed as dist

import iris
from iris.ccl import Config


def gathered(t):
    parts = [torch.empty_like(t.cpu()) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.cpu().contiguous())
    return parts


def main():
    parser = argparse.ArgumentParser(description="ccl collectives, back to back, checked")
    parser.add_argument("-m", type=int, default=40)
    parser.add_argument("-n", type=int, default=72)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--datatype", default="bf16", choices=["fp16", "bf16", "fp32"])
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="gloo")
    shmem = iris.iris(1 << 30)
    rank, W = shmem.get_rank(), shmem.get_num_ranks()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.datatype]
    M, N = args.m, args.n
    x = shmem.zeros((M, N), dtype=dtype)
    out = shmem.zeros((M, N), dtype=dtype)
    wrong = []
    for it in range(args.iterations):
        for variant in ("two_shot", "one_shot", "ring"):
            x.copy_(torch.randn(M, N, generator=torch.Generator().manual_seed(100 * it + rank)).to(dtype))
            shmem.ccl.all_reduce(out, x, config=Config(all_reduce_variant=variant))
            reference = sum(p.double() for p in gathered(x))
            # (the sum is taken in fp32 and rounded once to the dtype)
            error = (out.cpu().double() - reference).abs().max().item()
            if error > 1e-2 * max(1.0, reference.abs().max().item()):
                wrong.append(f"all_reduce {variant} iteration {it}: max error {error}")
            if any(not torch.equal(p, out.cpu()) for p in gathered(out)):
                wrong.append(f"all_reduce {variant} iteration {it}: ranks hold different bits")
        x.fill_(rank + it)
        everyone = shmem.zeros((W * M, N), dtype=dtype)
        shmem.ccl.all_gather(everyone, x)
        if any((everyone[r * M:(r + 1) * M].float() != r + it).any() for r in range(W)):
            wrong.append(f"all_gather iteration {it}")
        mixed = shmem.zeros((M, N * W), dtype=dtype)
        swapped = shmem.zeros((M, N * W), dtype=dtype)
        for q in range(W):
            mixed[:, q * N:(q + 1) * N] = 10 * rank + q + it
        shmem.ccl.all_to_all(swapped, mixed)
        if any((swapped[:, q * N:(q + 1) * N].float() != 10 * q + rank + it).any() for q in range(W)):
            wrong.append(f"all_to_all iteration {it}")
        config = Config(block_size_m=16, block_size_n=32)
        x.copy_(torch.arange(M * N).reshape(M, N) % 7 + rank)
        scattered = shmem.zeros((M, N), dtype=dtype)
        shmem.ccl.reduce_scatter(scattered, x, config=config)
        total = sum(p.float() for p in gathered(x))
        tiles_n = -(-N // 32)
        tiles = -(-M // 16) * tiles_n
        per_rank = -(-tiles // W)
        tile = (torch.arange(M)[:, None] // 16) * tiles_n + torch.arange(N)[None, :] // 32
        mine = (tile >= rank * per_rank) & (tile < (rank + 1) * per_rank)
        if not torch.equal(scattered.cpu().float()[mine], total[mine]):
            wrong.append(f"reduce_scatter iteration {it}")
    shmem.barrier()
    shmem.info(f"{args.iterations} rounds of all_reduce (3 variants), all_gather, all_to_all, reduce_scatter: "
               f"{'all right' if not wrong else 'WRONG: ' + '; '.join(wrong)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
