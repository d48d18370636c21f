"""An Iris-style program that ends badly on purpose, one way per --how, on --rank; the other ranks finish."""

import argparse
import os
import signal

import iris

parser = argparse.ArgumentParser()
parser.add_argument("--how", choices=["exit", "raise", "kill", "hang", "amd_clock"], required=True)
parser.add_argument("--rank", type=int, default=1)
args = parser.parse_args()

shmem = iris.iris(1 << 20)
rank = shmem.get_rank()
print(f"rank {rank} of {shmem.get_num_ranks()} started")
if rank == args.rank:
    if args.how == "exit":
        exit(4)
    if args.how == "raise":
        raise ValueError(f"rank index {rank + shmem.get_num_ranks()} is out of range")
    if args.how == "kill":
        os.kill(os.getpid(), signal.SIGSEGV)
    if args.how == "hang":
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def wait_forever(flag):
            while tl.atomic_add(flag, 0, sem="acquire", scope="sys") == 0:
                pass

        wait_forever[(1,)](shmem.zeros(1, dtype=torch.int32))
    if args.how == "amd_clock":   # AMD's clock, as Iris's GEMM examples read it: no interpreter can run it
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def read_amd_clock(out):
            t = tl.inline_asm_elementwise("s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                          is_pure=False, pack=1)
            tl.store(out, t)

        read_amd_clock[(1,)](shmem.zeros(1, dtype=torch.int64))
print(f"rank {rank} done")
