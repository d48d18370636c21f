"""Iris's example 15 in small: a GEMM-like kernel on one stream writes its tiles and raises a per-tile flag in
``locks``; a communication kernel on another stream waits for each flag (acquire) and reads the tile. One rank's
own two kernels, nothing remote. ``--flag plain`` raises the flag with a plain store, as example 15 does (a race:
the flag releases nothing); ``--flag release`` with a release exchange. ``--order`` says how the host orders
the two kernels: ``none`` (two streams, as example 15), ``wait_stream``, ``event``, ``synchronize`` or
``one_stream`` (both on one stream)."""

import argparse

import torch
import triton
import triton.language as tl

import iris

parser = argparse.ArgumentParser()
parser.add_argument("--flag", choices=["plain", "release"], default="plain")
parser.add_argument("--order", choices=["none", "wait_stream", "event", "synchronize", "one_stream"], default="none")
args = parser.parse_args()


@triton.jit
def produce(tiles, locks, BLOCK: tl.constexpr, RELEASE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(tiles + offsets, offsets.to(tl.float32) + 1)
    if RELEASE:
        tl.debug_barrier()
        tl.atomic_xchg(locks + pid, 1, sem="release", scope="gpu")
    else:
        tl.store(locks + pid, 1)


@triton.jit
def consume(tiles, locks, out, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    while tl.atomic_cas(locks + pid, 0, 0, sem="acquire", scope="gpu") != 1:
        pass
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(tiles + offsets))


shmem = iris.iris(1 << 20)
tiles, locks, out = shmem.zeros(4 * 16), shmem.zeros(4, dtype=torch.int32), shmem.zeros(4 * 16)
gemm_stream, comm_stream = torch.cuda.Stream(), torch.cuda.Stream()
if args.order == "one_stream":
    comm_stream = gemm_stream
shmem.barrier()
with torch.cuda.stream(gemm_stream):
    produce[(4,)](tiles, locks, 16, args.flag == "release")
    done = torch.cuda.Event()
    done.record()
if args.order == "wait_stream":
    comm_stream.wait_stream(gemm_stream)
elif args.order == "event":
    comm_stream.wait_event(done)
elif args.order == "synchronize":
    gemm_stream.synchronize()
with torch.cuda.stream(comm_stream):
    consume[(4,)](tiles, locks, out, 16)
torch.cuda.synchronize()
print(f"{int((out == tiles).sum())} of 64 values arrived")
shmem.barrier()
