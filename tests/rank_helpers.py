"""Code the tests run on the engines (imported there by module name): a kernel that uses every device-API
operation across ranks, so the test can check each one's effect on every rank."""

import contextlib

import torch
import triton
import triton.language as tl

from gemmar.kernels import device
from gemmar.runtime.heap import barrier_all
from gemmar.runtime.rank import local_ranks

BLOCK = 16


@triton.jit
def device_api_kernel(src, stored, put_into, loaded, got, counter, subtracted, maxed, minned, swapped,
                      swapped_old, cas_cell, cas_old, heap_bases, rank, world_size, valid,
                      SEM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < valid
    next_rank = (rank + 1) % world_size
    # load / get: read the next rank's src into local buffers.
    tl.store(loaded + offs, device.load(src + offs, rank, next_rank, heap_bases, mask=mask), mask=mask)
    device.get(src + offs, got + offs, rank, next_rank, heap_bases, mask=mask)   # (Iris: caller, then the peer)
    # store / put: write our src into the next rank's buffers (masked: the rest must stay zero).
    device.store(stored + offs, tl.load(src + offs), rank, next_rank, heap_bases, mask=mask)
    device.put(src + offs, put_into + offs, rank, next_rank, heap_bases, mask=mask)
    # atomics into every rank, with the semantics under test.
    for peer in range(world_size):
        device.atomic_add(counter + offs, tl.full((BLOCK,), 1, tl.int32), rank, peer, heap_bases, mask=mask,
                          sem=SEM, scope="sys")
        device.atomic_sub(subtracted + offs, tl.full((BLOCK,), 1, tl.int32) * (rank + 1), rank, peer, heap_bases,
                          mask=mask, sem=SEM, scope="sys")
        device.atomic_max(maxed + offs, tl.full((BLOCK,), 1, tl.int32) * rank, rank, peer, heap_bases, mask=mask,
                          sem=SEM, scope="sys")
        device.atomic_min(minned + offs, tl.full((BLOCK,), 1, tl.int32) * rank, rank, peer, heap_bases, mask=mask,
                          sem=SEM, scope="sys")
    old = device.atomic_xchg(swapped + offs, tl.full((BLOCK,), 1, tl.int32) * (rank + 1), rank, next_rank,
                             heap_bases, mask=mask, sem=SEM, scope="sys")
    tl.store(swapped_old + offs, old, mask=mask)
    # Every rank tries to claim rank 0's cell; exactly one sees 0.
    tl.store(cas_old, device.atomic_cas(cas_cell, 0, rank + 1, rank, 0, heap_bases, sem=SEM, scope="sys"))


def device_api_roundtrip(sem, valid):
    """Run device_api_kernel on every rank this engine hosts (one, or all when they share a GPU): every
    rank launches before any is waited for. Returns one dict per hosted rank."""
    group = local_ranks()
    heaps = [ctx.heap for ctx in group]
    W = group[0].world_size
    with contextlib.ExitStack() as scopes:
        for heap in heaps:
            scopes.enter_context(heap.scope())
        all_bufs = []
        for heap in heaps:
            src = heap.empty(BLOCK, torch.float32)
            src.copy_(torch.arange(BLOCK, dtype=torch.float32) + 100 * heap.rank)
            all_bufs.append((src, dict(
                stored=heap.zeros(BLOCK, torch.float32), put_into=heap.zeros(BLOCK, torch.float32),
                loaded=heap.zeros(BLOCK, torch.float32), got=heap.zeros(BLOCK, torch.float32),
                counter=heap.zeros(BLOCK, torch.int32), subtracted=heap.full(BLOCK, 1000, torch.int32),
                maxed=heap.full(BLOCK, -1, torch.int32), minned=heap.full(BLOCK, 1000, torch.int32),
                swapped=heap.zeros(BLOCK, torch.int32), swapped_old=heap.full(BLOCK, -7, torch.int32),
                cas_cell=heap.zeros(1, torch.int32), cas_old=heap.full(1, -7, torch.int32))))
        barrier_all(heaps)
        for heap, (src, bufs) in zip(heaps, all_bufs):
            with heap.on_stream():
                device_api_kernel[(1,)](src, *bufs.values(), heap.heap_bases, heap.rank, W, valid, SEM=sem,
                                        BLOCK=BLOCK)
        barrier_all(heaps)
        outs = []
        for heap, (src, bufs) in zip(heaps, all_bufs):
            out = {name: t.cpu().numpy() for name, t in bufs.items()}
            out["offsets"] = [heap.offset_of(t) for t in bufs.values()]
            outs.append(out)
        barrier_all(heaps)
        return outs


def finishing_quietly(seconds):
    """Report progress only through the rank's progress file, never over ipyparallel's channel: what a rank
    looks like to a client whose IOPub channel has failed (test_shared_server)."""
    import os
    import time

    from gemmar.runtime import rank

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with open(rank._progress_file, "a"):
            os.utime(rank._progress_file)
        time.sleep(0.2)
    return "done"


def silent(seconds):
    """Report nothing at all for ``seconds``."""
    import time

    time.sleep(seconds)
