"""Where the standalone all-reduce's time goes at one rank on a GPU: host time per call, and each kernel's
GPU time (torch.profiler), for the sizes given. Prints one line per size and the profiler's kernel table.

    python3 benchmarks/allreduce_cost.py --sizes 1 16      # MiB, bf16, one rank, GPU 0
"""

import argparse
import time

import torch

from gemmar.runtime.allreduce import SymmetricAllReduce
from gemmar.runtime.heap import create_heap, make_heap_folder, remove_arenas


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 16], help="MiB of bf16 values")
    parser.add_argument("--comm_sms", type=int, default=16)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--scheme", default="two_shot")
    args = parser.parse_args()
    folder = make_heap_folder()
    try:
        measure(create_heap("cuda", 0, 1, 1 << 30, folder, 60.0), args)
    finally:
        remove_arenas(folder)


def measure(heap, args):
    for mib in args.sizes:
        numel = int(mib * 2 ** 20) // 2
        with heap.scope():
            op = SymmetricAllReduce(heap, numel, torch.bfloat16, args.comm_sms, scheme=args.scheme)
            op.prepare()
            x = torch.randn(numel, device="cuda").to(torch.bfloat16)
            for _ in range(5):
                op(x)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.calls):
                op(x, wait=False)
            enqueued = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
            host_us = (enqueued - start) / args.calls * 1e6
            total_us = (done - start) / args.calls * 1e6
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    op(x, wait=False)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.key_averages():
                if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "device_time_total", 0):
                    kernels[e.key] = getattr(e, "device_time_total", 0) / 20
            gpu_us = sum(kernels.values())
            print(f"{mib:g} MiB {args.scheme}: host {host_us:.1f} us/call, wall {total_us:.1f} us/call, GPU kernels "
                  f"{gpu_us:.1f} us/call: " + ", ".join(f"{k[:40]} {v:.1f}" for k, v in kernels.items()), flush=True)
            op.check()


if __name__ == "__main__":
    main()
