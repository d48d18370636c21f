"""The symmetric heap: one arena per rank, the same allocations at the same offsets on every rank.

This module holds what every backend shares (allocation, the barrier, the watchdog check); ``cpu.py``,
``cuda.py`` and ``iris.py`` only make and map the arenas, and ``create_heap`` in ``__init__`` picks one.

Each rank's process sees every rank's arena at some address; ``heap_bases[q]`` is where rank ``q``'s
arena starts *in this process*. The device API turns an address in our arena into the same offset in a
peer's arena with those bases. Allocation is a bump pointer that every rank moves the same way (all ranks
make the same calls in the same order), so a buffer has the same offset everywhere.

Backends differ only in how arenas are made and mapped:

- ``cpu``: a shared-memory file per rank (``/dev/shm``), mapped by every rank's process; kernels run
  under the Triton interpreter. Each file is unlinked as soon as every rank has mapped it, so nothing is
  left in ``/dev/shm`` after the cluster stops, or after a rank dies.
- ``cuda``: torch symmetric memory (``symm_mem.empty`` + ``rendezvous``) gives the peers' pointers.
- ``iris``: real Iris on ROCm, which hands over its own heap bases.
"""

import contextlib
import time

import numpy as np
import torch

from ...errors import ClusterError, DeadlockError, RankLeftError, UsageError
from ...sanitizer import host_event
from ...sanitizer.record import element_text
from ...kernels.device import FLAG_WORDS, place, register_heap_bases
from ...kernels.watchdog import EXPIRED_WAIT_LINES, WATCHDOG_WORDS, read_watchdog
from ...kernels import barrier as barrier_kernels

ALIGN = 256
HEADER_BYTES = 256         # barrier counter + barrier watchdog at the start of every arena
# The barrier watchdog's first word when a rank the barrier waits for has ended (an expiry writes 1): the
# waiting kernel polls the word and gives up (give_up_barrier; gemmar/programs/departures.py).
RANK_LEFT = -1
DEFAULT_HEAP_BYTES = 256 << 20


def size_text(nbytes):
    """Bytes for people: 1.5 GiB, 200 MiB, 512 B."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} B"


class SymmetricHeap:
    """Bookkeeping shared by all backends: allocation, the barrier, the bases."""

    backend = "?"
    # This rank's streams on GPUs (torch.cuda.Stream): launches run on ``stream``, two_shot's reduction on
    # ``side_stream``. None where there are no streams (cpu).
    stream = side_stream = None

    def __init__(self, rank, world_size, arena, heap_bases, device, timeout_s):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.arena = arena                   # this rank's arena: a uint8 tensor on `device`
        self.heap_bases = heap_bases         # int64 tensor on `device`: every arena, as this process sees it
        self.size = arena.numel()
        self.timeout_s = timeout_s
        self.ranks_on_device = 1             # how many ranks share this rank's GPU (all of them, or just one)
        self._forget_bases = register_heap_bases(heap_bases.data_ptr(), rank, world_size)
        misaligned = [b for b in heap_bases.tolist() if b % ALIGN]
        if misaligned:  # device.translate relies on heaps starting on ALIGN-byte boundaries
            raise ClusterError(f"rank {rank}: heap bases {misaligned} are not {ALIGN}-byte aligned")
        self._top = HEADER_BYTES
        # Iris programs (gemmar run, %%px) take their tensors from the heap's end, downwards, so that what a
        # program allocates -- on some ranks and not others, or still held when its cell ends -- never moves
        # the offsets that gemmar's own runs hand out from the start, which must be the same on every rank.
        self._end = self.size
        self._program_allocations = False   # inside allocating_for_program(): every allocation from the end
        self._barriers = 0
        self._rank_left, self._barrier_out_of_step = None, False   # (give_up_barrier)
        # What lives where, for the sanitizer's bounds checks and reports: offset -> [bytes, name, shape, dtype].
        self._allocations = {0: [HEADER_BYTES, "heap header (barrier, watchdog)", (HEADER_BYTES,), "uint8"]}
        self._table = None
        words = self.arena[:HEADER_BYTES].view(torch.int64)
        self._barrier_counter = words[0:1]
        self._barrier_watchdog = words[8:8 + WATCHDOG_WORDS]
        self._barrier_exit = words[24:25]

    # -- allocation -----------------------------------------------------------------------------------
    def _alloc(self, nbytes, from_end=False, alignment=ALIGN):
        if alignment < 1 or alignment & (alignment - 1):
            raise UsageError(f"heap alignment {alignment}: use a power of two")
        align = max(ALIGN, alignment)   # (both powers of two)
        if from_end:
            offset = (self._end - nbytes) // align * align
            if offset < self._top:
                raise UsageError(f"heap too small: {nbytes} more bytes do not fit in the {self._end - self._top} "
                                 f"left of this rank's {self.size}-byte heap")
            self._end = offset
            return offset
        offset = -(-self._top // align) * align
        if offset + nbytes > self._end:
            held = f" ({self.size - self._end} of them held by an Iris program's tensors)" if self._end < self.size else ""
            raise UsageError(f"heap too small: this run needs {offset + nbytes} bytes of symmetric heap per rank, "
                             f"the heap has {self.size}{held}; start the Cluster with a larger heap_size")
        self._top = offset + nbytes
        return offset

    def empty(self, shape, dtype, from_end=False, alignment=ALIGN):
        """A tensor on the heap, its first byte at a multiple of ``alignment`` (a power of two; at least ALIGN)."""
        from_end = from_end or self._program_allocations
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for s in shape:
            count *= s
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        offset = self._alloc(nbytes, from_end, alignment)
        if nbytes:   # (an empty tensor holds no byte; it would share its offset with a neighbour's entry)
            self._allocations[offset] = [nbytes, f"heap tensor at byte {offset}", shape,
                                         str(dtype).replace("torch.", "")]
            self._table = None
        return self.arena[offset:offset + nbytes].view(dtype).view(shape)

    def name(self, tensor, name):
        """Give an allocation the name the sanitizer's reports use (e.g. ``partials``)."""
        entry = self._allocations.get(self.offset_of(tensor))
        if entry is not None:
            entry[1] = name
            self._table = None

    def name_all(self, owner):
        """Name every heap tensor among ``owner``'s attributes after its attribute (a kernel's buffers)."""
        for name, value in vars(owner).items():
            if isinstance(value, torch.Tensor):
                self.name(value, name)

    def _forget(self, keep):
        self._allocations = {o: e for o, e in self._allocations.items() if o == 0 or keep(o)}
        self._table = None

    def allocation_table(self):
        """(starts, ends, [(name, shape, dtype)]) of the live allocations, sorted by offset."""
        if self._table is None:
            items = sorted(self._allocations.items())
            self._table = (np.array([o for o, _ in items], dtype=np.int64),
                           np.array([o + e[0] for o, e in items], dtype=np.int64),
                           [(e[1], e[2], e[3]) for _, e in items])
        return self._table

    def describe_offset(self, offset):
        """``partials[3, 17]``-style: the allocation holding byte ``offset`` and the element there."""
        starts, ends, labels = self.allocation_table()
        i = int(np.searchsorted(starts, offset, side="right")) - 1
        if i < 0 or offset >= ends[i]:
            return f"byte {offset}, in no buffer"
        return element_text(labels[i], offset - int(starts[i]))

    def release_program_memory(self):
        """Everything taken from the heap's end (an Iris program's tensors) is free again."""
        end, self._end = self._end, self.size
        self._forget(lambda offset: offset < end)

    @contextlib.contextmanager
    def allocating_for_program(self):
        """Allocations made inside come from the heap's end, as an Iris program's tensors do: what gemmar's
        own kernels allocate for a program (``iris.ccl``, ``iris.ops``) lives and dies with the program."""
        before = self._program_allocations
        self._program_allocations = True
        try:
            yield self
        finally:
            self._program_allocations = before

    def zeros(self, shape, dtype):
        return self.empty(shape, dtype).zero_()

    def full(self, shape, value, dtype):
        return self.empty(shape, dtype).fill_(value)

    @contextlib.contextmanager
    def scope(self):
        """Allocations made inside are released on exit (on every rank alike: keep the calls symmetric)."""
        top = self._top
        try:
            yield self
        finally:
            self._top = top
            self._forget(lambda offset: offset < top or offset >= self._end)

    def offset_of(self, tensor):
        return tensor.data_ptr() - self.arena.data_ptr()

    # -- synchronisation ------------------------------------------------------------------------------
    def synchronize(self):
        """Wait for this rank's device work (no-op on cpu)."""
        host_event("sync")

    def on_stream(self):
        """The context this rank's launches run in. On GPUs each rank has its own stream, so that ranks
        sharing a GPU run at the same time; on cpu there is nothing to choose."""
        return contextlib.nullcontext()

    def join_side_stream(self):
        """Make what this rank runs next on its main stream wait for the side stream's work so far."""
        host_event("join", into="main", waits_for="side")

    def delay(self, seconds):
        """Hold this rank back before its next launch (a straggler, for stress tests)."""
        time.sleep(seconds)

    def barrier(self, timeout_s=None, wait=True):
        """All ranks meet here; returns ``now()`` (device clock, ns) as this rank left.

        A rank that never arrives raises DeadlockError after ``timeout_s``. With ``wait=False`` (GPU
        timing loops) the barrier is only enqueued behind this rank's work: no host synchronisation, no
        return value; call :meth:`check_barrier` once afterwards.
        """
        from ...kernels.barrier import barrier_kernel

        if wait:
            self.synchronize()
        self._barriers += 1
        timeout_ns = int((timeout_s or self.timeout_s) * 1e9)
        with self.on_stream():
            barrier_kernel[(1,)](self._barrier_counter, self._barrier_watchdog, self._barrier_exit,
                                 self.heap_bases, self.rank, self._barriers * self.world_size, timeout_ns)
        if wait:
            self.synchronize()
            self.check_barrier()
            return self.barrier_exit_ns()

    def barrier_exit_ns(self):
        """``now()`` as this rank last left the barrier (after a synchronize)."""
        return int(self._barrier_exit.item())

    def check_barrier(self):
        if self._rank_left is not None and int(self._barrier_watchdog[0]) == RANK_LEFT:
            if self._barrier_count() < self._barriers * self.world_size:   # (not completed after all)
                self._barrier_out_of_step = True
                raise RankLeftError(f"{self._rank_left} before the barrier")
            return
        self.raise_if_expired(self._barrier_watchdog, barrier_kernels.WAIT_FLAGS)

    def give_up_barrier(self, why):
        """Make this rank's barrier waits (the one running now, and every later one) give up, where the host
        can write the watchdog under a running barrier kernel (cpu): ``why`` ('rank 1 ended (exit code 0)')
        begins the RankLeftError that the barrier then raises. Called from another thread."""

    def forget_given_up_barrier(self):
        """Clear what :meth:`give_up_barrier` set; True when a barrier gave up since (this rank's barrier count
        is out of step with the others': fresh ranks are needed)."""
        out_of_step, self._barrier_out_of_step = self._barrier_out_of_step, False
        if self._rank_left is not None:
            self._rank_left = None
            self._barrier_watchdog.zero_()
        return out_of_step

    def _barrier_count(self):
        """The barrier counter (in rank 0's heap) as this host sees it."""
        raise NotImplementedError

    def raise_if_expired(self, watchdog, wait_flags):
        """Raise DeadlockError if a wait of the kernel that wrote ``watchdog`` expired, naming its flag from
        ``wait_flags`` (the kernel's flag names -> ids)."""
        report = read_watchdog(watchdog.tolist(), wait_flags)
        line = EXPIRED_WAIT_LINES.pop(watchdog.data_ptr(), None)
        if report is not None:
            watchdog.zero_()
            report.update(self._flag_waited_on(report.pop("address"), report))
            if line is not None:
                report["line"] = place(line)
            raise DeadlockError([report])

    def _flag_waited_on(self, address, report):
        """``{"waited_on": "ready[4]"}`` (or "rank 1's ready[4]") when the address a wait polled is not the flag
        its report names (``report``'s flag and index: a flag of FLAG_WORDS-spaced counters counts too); else {}.
        The allocations are the same on every rank, so another rank's heap is read by this one's table."""
        if report["flag"] == "barrier":   # (rank 0's counter, in the heap header)
            return {}
        bases = self.heap_bases.tolist()
        owner = next((q for q, base in enumerate(bases) if base <= address < base + self.size), None)
        if owner is None:
            return {"waited_on": f"address {address:#x}, in no rank's heap"}
        offset = address - int(bases[owner])
        starts, ends, labels = self.allocation_table()
        i = int(np.searchsorted(starts, offset, side="right")) - 1
        if i < 0 or offset >= ends[i]:
            return {"waited_on": f"byte {offset} of rank {owner}'s heap, in no buffer"}
        name, _, dtype = labels[i]
        element = (offset - int(starts[i])) // torch.empty((), dtype=getattr(torch, dtype)).element_size()
        if owner == self.rank and name == report["flag"] and element in (report["index"],
                                                                        report["index"] * FLAG_WORDS):
            return {}
        text = self.describe_offset(offset)
        return {"waited_on": text if owner == self.rank else f"rank {owner}'s {text}"}

    def close(self):
        self._forget_bases()
        self.arena = None
        self.heap_bases = None


def barrier_all(heaps, timeout_s=None):
    """The barrier for every rank this process hosts (one, or several sharing a GPU): enqueue each rank's
    part first, then wait for all; a rank that waited on its own would hold back the others' launches.
    Returns each rank's exit time (ns)."""
    for heap in heaps:
        heap.synchronize()
    for heap in heaps:
        heap.barrier(timeout_s, wait=False)
    for heap in heaps:
        heap.synchronize()
        heap.check_barrier()
    return [heap.barrier_exit_ns() for heap in heaps]
