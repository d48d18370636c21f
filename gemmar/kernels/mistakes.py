"""The teaching mistakes: each is a function that takes the place of one of a kernel's parts (a spec's
``mistake_parts``: mistake name -> {part name: function}), the one mechanism a puzzle's answer uses too.
The kernels themselves hold no branch for a mistake: ``mistake="skip_slot_free_wait"`` runs the ring kernel
with :func:`skip_the_wait` as its ``slot_free_wait``, and nothing else changes.

Each one goes wrong for real (``tests/test_mistakes.py``): the wrong sum, the overwritten slot, the read of
a partial before it is written, the wait that never ends (reported as a DeadlockError naming rank, tile and
flag).
"""

import triton
import triton.language as tl

from . import device


@triton.jit
def forward_running_sum(total, received):
    """In place of the ring's ``reduce_step``: the wrong payload, so that from three ranks on some partials are
    counted several times (with two there is one step, and it happens to be right)."""
    total = total + received
    return total, total


@triton.jit
def skip_the_wait(flag, target, timeout_ns, watchdog, rank, tile_id, FLAG_KIND: tl.constexpr):
    """In place of a wait (``device.wait_for_tile``): go on at once, whatever the flag says. What follows
    then reads (or overwrites) data a peer has not written (or read) yet, and only a late peer shows it."""
    pass


@triton.jit
def wait_one_too_many(flag, target, timeout_ns, watchdog, rank, tile_id, FLAG_KIND: tl.constexpr):
    """In place of a wait: wait for one signal more than will ever come. Every rank hangs there until the
    watchdog gives up, and the host raises a DeadlockError naming rank, tile and flag."""
    device.wait_for_tile(flag, target + 1, timeout_ns, watchdog, rank, tile_id, FLAG_KIND)
