"""Iris programs that do what the interpreter cannot run as they are, one per --how: a false tl.assume
(the run goes on, warned once per line), reading n_regs after a launch, Gluon, mp.spawn of another size."""

import argparse

import torch
import torch.multiprocessing as mp
import triton
import triton.language as tl

import iris

parser = argparse.ArgumentParser()
parser.add_argument("--how", choices=["assume", "n_regs", "gluon", "spawn"], required=True)
args = parser.parse_args()


@triton.jit
def first_row_assumed_away(out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    tl.assume(pid > 0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, offsets.to(tl.float32) + 1, mask=offsets < n)


def worker(rank, world_size):
    shmem = iris.iris(1 << 20)
    out = shmem.zeros(100, dtype=torch.float32)
    launch = first_row_assumed_away[(4,)](out, 100, 32)
    launch = first_row_assumed_away[(4,)](out, 100, 32)   # (the same line warns once)
    print(f"rank {rank}: out holds {int(out.sum())}")
    if args.how == "n_regs":
        print(launch.n_regs)


if args.how == "gluon":
    from iris.gluon import IrisDeviceCtx  # noqa: F401
mp.spawn(worker, args=(2,), nprocs=7 if args.how == "spawn" else int(__import__("os").environ["WORLD_SIZE"]))
