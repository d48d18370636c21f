"""Iris's device-side tracing: each rank's kernel puts a block to every other rank and raises a flag there,
then waits for every peer's flag and sums what arrived, bracketing each step with ``ctx.tracing``
(``put``, ``wait``, ``reduce`` events). The host enables tracing, runs the kernel twice (the first run's
events are reset away, as Iris's examples do after warm-up), checks the sums and exports the merged trace:

    gemmar run -r 3 examples/iris_today/device_tracing.py --output /tmp/device_trace.json
    gemmar gantt /tmp/device_trace.json -o /tmp/device_trace.png --perfetto /tmp/device_trace_perfetto.json
"""

import argparse

import torch
import triton
import triton.language as tl

import iris
from iris import DeviceContext, TraceEvent


@triton.jit
def exchange_and_sum(context, source, inbox, flags, sums, n, rank: tl.constexpr, world_size: tl.constexpr,
                     BLOCK: tl.constexpr, TRACING: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size, tracing=TRACING)
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    for peer in range(world_size):   # inbox holds one row per sender
        if peer != rank:
            slot = inbox + rank * n + offsets
            handle = ctx.tracing.record_event_start(event_id=TraceEvent().put, target_rank=peer, address=slot,
                                                    pid_m=pid, pid_n=peer, mask=mask)
            ctx.put(source + offsets, slot, to_rank=peer, mask=mask)
            ctx.tracing.record_event_end(handle)
            ctx.atomic_add(flags + pid, 1, to_rank=peer, sem="release", scope="sys")
    handle = ctx.tracing.record_event_start(event_id=TraceEvent().wait, target_rank=rank, address=flags + pid,
                                            pid_m=pid, pid_n=rank)
    while ctx.atomic_cas(flags + pid, world_size - 1, 0, to_rank=rank, sem="acquire", scope="sys") != world_size - 1:
        pass
    ctx.tracing.record_event_end(handle)
    handle = ctx.tracing.record_event_start(event_id=TraceEvent().reduce, target_rank=rank, address=sums + offsets,
                                            pid_m=pid, pid_n=rank, mask=mask)
    total = tl.load(source + offsets, mask=mask, other=0.0)
    for peer in range(world_size):
        if peer != rank:
            total += tl.load(inbox + peer * n + offsets, mask=mask, other=0.0)
    tl.store(sums + offsets, total, mask=mask)
    ctx.tracing.record_event_end(handle)


def main():
    parser = argparse.ArgumentParser(description="traced puts, waits and sums; the trace exported for Perfetto")
    parser.add_argument("-s", "--buffer_size", type=int, default=1000)
    parser.add_argument("-b", "--block_size", type=int, default=256)
    parser.add_argument("-o", "--output", default="device_trace.json")
    parser.add_argument("--max_events", type=int, default=10_000)
    args = parser.parse_args()
    shmem = iris.iris(1 << 24)
    rank, world_size, n = shmem.get_rank(), shmem.get_num_ranks(), args.buffer_size
    shmem.tracing.enable(max_events=args.max_events)
    context = shmem.get_device_context()
    source = shmem.arange(n, dtype=torch.float32) + 1000 * rank
    inbox = shmem.zeros(world_size * n, dtype=torch.float32)
    flags = shmem.zeros(triton.cdiv(n, args.block_size), dtype=torch.int32)
    sums = shmem.zeros(n, dtype=torch.float32)
    expected = sum(torch.arange(n, dtype=torch.float32) + 1000 * r for r in range(world_size))
    programs = triton.cdiv(n, args.block_size)
    for run in range(2):
        sums.zero_()
        shmem.barrier()
        exchange_and_sum[(programs,)](context, source, inbox, flags, sums, n, rank, world_size, args.block_size,
                                      TRACING=True)
        shmem.barrier()
        right = bool(torch.equal(sums.cpu(), expected))
        shmem.info(f"run {run}: sums {'right' if right else 'WRONG'}; "
                   f"{shmem.tracing.trace_counter.item()} events recorded")
        if run == 0:
            shmem.tracing.reset()
    shmem.tracing.export(args.output, merge=True)


if __name__ == "__main__":
    main()
