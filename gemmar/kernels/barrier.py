"""A barrier across ranks built from the device API: one counter in rank 0's heap.

Barrier number ``b`` (1, 2, ...) is passed when ``world_size * b`` ranks have arrived. The counter only
grows, so it never needs a reset. It runs as a one-program launch on every rank, with the same watchdog
as the kernels: a rank that never arrives turns into a DeadlockError, not a hang.

Its scalar arguments are not specialised (``do_not_specialize``): a new value must never make Triton compile
and load a new variant while another rank's kernel spins on the same GPU, since loading a module can wait
for the kernels already running - here, forever.

It also writes ``now()`` at the moment this rank leaves the barrier: all ranks leave within the time it
takes the last arrival to become visible, so these stamps line up the clocks of different devices.
"""

import triton
import triton.language as tl

from . import device

WAIT_FLAGS = {"barrier": 1}
BARRIER_FLAG = tl.constexpr(WAIT_FLAGS["barrier"])


@triton.jit(do_not_specialize=["rank", "target", "timeout_ns"])
def barrier_kernel(counter, watchdog, exit_time, heap_bases, rank, target, timeout_ns):
    device.atomic_add(counter, 1, rank, 0, heap_bases, sem="acq_rel", scope="sys")
    on_rank0 = device.translate(counter, rank, 0, heap_bases)
    device.wait_at_least(on_rank0, target, timeout_ns, watchdog, rank, -1, BARRIER_FLAG, 0)
    tl.store(exit_time, device.now())


@triton.jit(do_not_specialize=["duration_ns"])
def spin_kernel(duration_ns):
    """Keep one program busy for ``duration_ns``: a rank that starts its next launch late (stress tests)."""
    start = device.now()
    while device.now() - start < duration_ns:
        device.pause()
