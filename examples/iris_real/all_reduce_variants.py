"""Every variant of Iris's own all-reduce (iris.ccl, Iris's kernels in iris/ccl/triton/all_reduce.py), checked
against torch.distributed's all-reduce of the same inputs, several calls back to back.

    gemmar run -r 2 --backend cpu --iris IRIS_CHECKOUT examples/iris_real/all_reduce_variants.py -m 48 -n 80

Iris's own tests leave `ring` and `spinlock` out ("when support for cache-modifiers is in place"): here they run.
Exit 1 when a variant gives a wrong sum on some rank.
"""

import argparse
import os

import torch
import torch.distributed as dist

import iris
from iris.ccl import Config

VARIANTS = ("atomic", "spinlock", "one_shot", "ring", "two_shot")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 1.6e-1, torch.float32: 1e-5}   # (inputs are N(0, 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", type=int, default=48)
    parser.add_argument("-n", type=int, default=80)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--calls", type=int, default=3, help="back-to-back calls per variant")
    parser.add_argument("--block", type=int, nargs=2, default=(16, 32), metavar=("M", "N"))
    parser.add_argument("--comm_sms", type=int, default=4)
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="gloo")
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    dtype = DTYPES[args.dtype]
    wrong = 0
    for variant in args.variants:
        config = Config(all_reduce_variant=variant, block_size_m=args.block[0], block_size_n=args.block[1],
                        comm_sms=args.comm_sms)
        source = ctx.zeros((args.m, args.n), dtype=dtype)
        result = ctx.zeros((args.m, args.n), dtype=dtype)
        workspace = None
        for call in range(args.calls):
            generator = torch.Generator().manual_seed(1000 * call + rank)
            mine = torch.randn(args.m, args.n, generator=generator).to(dtype)
            source.copy_(mine)
            if variant == "atomic":
                result.zero_()   # (the atomic variant adds into its output)
            ctx.barrier()
            workspace = ctx.ccl.all_reduce(result, source, config=config, workspace=workspace)
            torch.cuda.synchronize()
            ctx.barrier()
            expected = mine.to(torch.float64)
            dist.all_reduce(expected)
            diff = (result.to(torch.float64).cpu() - expected).abs().max().item()
            ok = diff <= TOLERANCE[dtype] * world
            wrong += not ok
            print(f"{variant:9s} call {call}: max |C - sum| = {diff:.3g} {'ok' if ok else 'WRONG'}", flush=True)
    ctx.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
