"""An ``iris`` module for Iris programs run on gemmar's ranks, written from Iris's public API.

``gemmar run -r N script.py``, ``Cluster.run_script`` and ``%%px`` cells (after ``Cluster.activate()``)
put this module in ``sys.modules["iris"]`` on every rank, so that a program written for Iris
(``import iris; shmem = iris.iris(heap_size)``) runs unchanged on CPU ranks (the Triton interpreter over
shared memory) or on NVIDIA GPUs. It is never installed in place of an Iris the user has installed, unless
asked (``gemmar run --replace_iris``).

Host side: :func:`iris` returns an :class:`Iris` over this rank's symmetric heap (the one gemmar built when
the rank started; ``--heap_size``), with Iris's methods and allocators; :func:`do_bench` and
:func:`memset_tensor`. Device side: gemmar's device API (``gemmar.kernels.device``), whose argument order is
Iris's: ``load(ptr, to_rank, from_rank, heap_bases)``, ``store(ptr, value, from_rank, to_rank,
heap_bases)``, ``get``/``put(from_ptr, to_ptr, from_rank, to_rank, heap_bases)``, and the atomics
``atomic_*(ptr, value, from_rank, to_rank, heap_bases, mask=, sem=, scope=)``.

Two things differ from Iris, on purpose:

- the heap is the rank's gemmar heap: a call ``iris.iris(heap_size)`` asking for more than it has gets it
  anyway, with one line saying so; an allocation that does not fit is refused in one line. Each call of
  ``iris.iris`` hands the heap out afresh (re-running a notebook's setup cell reuses the memory instead of
  running out of it): tensors from an earlier call share memory with the new ones. A program's tensors
  come from the heap's end and are free again when it ends, so that gemmar's own runs on the same ranks
  (which hand out from the start) stay symmetric whatever the program allocated on which rank.
- ``wall_clock_rate`` is the rate of gemmar's ``now()`` (ns: 1e6 kHz), the clock its kernels trace with.
"""

import math
import os
import statistics
import struct
import time

import torch
import triton
import triton.language as tl

from .errors import UsageError
from .kernels.device import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_sub,
                             atomic_xchg, atomic_xor, get, load, put, store, translate)
from .runtime.heap import HEADER_BYTES, size_text

__all__ = ["Iris", "iris", "do_bench", "memset_tensor", "translate", "load", "store", "get", "put", "atomic_add",
           "atomic_sub", "atomic_cas", "atomic_xchg", "atomic_min", "atomic_max", "atomic_and", "atomic_or",
           "atomic_xor"]

# Set by the runner on every rank before the program runs (``runtime/scripts.py``).
_rank_heap = None


def _this_rank_heap():
    if _rank_heap is None:
        raise UsageError("iris.iris() works on gemmar's ranks only: run the program with `gemmar run -r N "
                         "script.py`, Cluster.run_script, or in a %%px cell after Cluster.activate()")
    return _rank_heap


def _shape(size):
    """Iris's allocators take a shape as separate ints or as one tuple/list."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in size):
        raise UsageError(f"shape {size!r} is not allowed: use whole numbers >= 0")
    return tuple(size)


@triton.jit
def _fetch_from(buffer, source_rank, my_rank, heap_bases, N: tl.constexpr):
    offsets = tl.arange(0, N)
    get(buffer + offsets, buffer + offsets, source_rank, my_rank, heap_bases)


class Iris:
    """This rank's view of the symmetric heap, with Iris's host methods."""

    def __init__(self, heap_size=1 << 30):
        self._heap = _this_rank_heap()
        usable = self._heap.size - HEADER_BYTES
        if heap_size > self._heap.size and self.get_rank() == 0:
            self.log(f"iris.iris(heap_size={size_text(heap_size)}): each rank's heap is {size_text(self._heap.size)} "
                     f"(gemmar run --heap_size); allocations past that are refused")
        self._heap.release_program_memory()   # hand the heap out afresh (see the module's docstring)
        self.heap_size = usable

    # -- who and where --------------------------------------------------------------------------------
    def get_rank(self):
        return self._heap.rank

    def get_num_ranks(self):
        return self._heap.world_size

    def get_device(self):
        return self._heap.arena.device

    def get_cu_count(self):
        """The GPU's multiprocessors; on the cpu backend the machine's cores."""
        if self._heap.arena.device.type == "cuda":
            return torch.cuda.get_device_properties(self._heap.arena.device).multi_processor_count
        return os.cpu_count() or 1

    def get_heap_bases(self):
        return self._heap.heap_bases

    def wall_clock_rate(self, rank=None):
        """kHz of the clock gemmar's kernels read (``now()``, in ns)."""
        return 1_000_000

    # -- logging --------------------------------------------------------------------------------------
    def log(self, message):
        # (gemmar run and %%px already say which rank a line comes from)
        print(f"[Iris] {message}", flush=True)

    def log_stats(self, message):
        self.log(message)

    def log_debug(self, message):
        if os.environ.get("IRIS_DEBUG"):
            self.log(message)

    # -- collectives ----------------------------------------------------------------------------------
    def barrier(self):
        """Every rank's device work done, then every rank meets (a rank that never comes: DeadlockError)."""
        self._heap.barrier()

    def broadcast(self, value, source_rank):
        """``source_rank``'s value (an int, float or bool) on every rank."""
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if hasattr(value, "item") and not isinstance(value, (int, float)):   # numpy scalars
            value = value.item()
        if not isinstance(value, (bool, int, float)):
            raise UsageError(f"broadcast({type(value).__name__}): gemmar's iris broadcasts an int, float or bool")
        if not isinstance(source_rank, int) or not 0 <= source_rank < self.get_num_ranks():
            raise UsageError(f"broadcast source_rank={source_rank!r}: use a rank from 0 to {self.get_num_ranks() - 1}")
        kind = 2 if isinstance(value, bool) else 0 if isinstance(value, int) else 1
        bits = struct.unpack("<q", struct.pack("<d", value))[0] if kind == 1 else int(value)
        heap = self._heap
        with heap.scope():
            word = heap.zeros(2, torch.int64)
            if self.get_rank() == source_rank:
                word.copy_(torch.tensor([kind, bits], dtype=torch.int64))
            heap.barrier()
            with heap.on_stream():
                _fetch_from[(1,)](word, source_rank, self.get_rank(), heap.heap_bases, 2)
            heap.barrier()   # every rank has read it before the source reuses the memory
            kind, bits = word.tolist()
        return bool(bits) if kind == 2 else bits if kind == 0 else struct.unpack("<d", struct.pack("<q", bits))[0]

    # -- allocators (every rank makes the same calls in the same order: same offsets everywhere) -------
    def allocate(self, num_elements, dtype):
        try:
            return self._heap.empty((num_elements,), dtype, from_end=True)
        except UsageError:   # (the heap's own check; said here in the terms of gemmar run)
            nbytes = num_elements * torch.empty((), dtype=dtype).element_size()
            raise UsageError(f"the symmetric heap is full: {num_elements} x {dtype} needs {size_text(nbytes)} more "
                             f"than is left of the {size_text(self._heap.size)} each rank has; start the ranks with "
                             f"a larger --heap_size") from None

    def _new(self, size, dtype):
        shape = _shape(size)
        return self.allocate(math.prod(shape), dtype).view(shape)

    def empty(self, *size, dtype=None, device=None, requires_grad=False, **unused):
        return self._new(size, dtype or torch.get_default_dtype()).requires_grad_(requires_grad)

    def zeros(self, *size, dtype=torch.int, device=None, requires_grad=False, **unused):
        return self._new(size, dtype).zero_().requires_grad_(requires_grad)

    def ones(self, *size, dtype=None, device=None, requires_grad=False, **unused):
        return self._new(size, dtype or torch.get_default_dtype()).fill_(1).requires_grad_(requires_grad)

    def full(self, size, fill_value, dtype=torch.int, device=None, **unused):
        return self._new((size,), dtype).fill_(fill_value)

    def zeros_like(self, tensor, dtype=None, **unused):
        return self._new((tuple(tensor.shape),), dtype or tensor.dtype).zero_()

    def _filled(self, size, dtype, values):
        t = self._new(size, dtype)
        t.copy_(values.reshape(t.shape))
        return t

    def randn(self, *size, generator=None, dtype=None, device=None, requires_grad=False, **unused):
        dtype = dtype or torch.get_default_dtype()
        shape = _shape(size)
        values = torch.randn(shape, generator=generator, dtype=dtype, device=self.get_device())
        return self._filled(shape, dtype, values).requires_grad_(requires_grad)

    def uniform(self, size, low=0.0, high=1.0, dtype=torch.float, **unused):
        return self._new((size,), dtype).uniform_(low, high)

    def randint(self, *args, dtype=torch.int, device=None, generator=None, **unused):
        """Iris's ``randint(size, low, high)``, or torch's ``randint([low,] high, size)`` (size a tuple)."""
        if len(args) in (2, 3) and isinstance(args[-1], (tuple, list, torch.Size)):
            low, high, size = args if len(args) == 3 else (0, *args)
        elif len(args) == 3:
            size, low, high = args
        else:
            raise UsageError(f"randint{args!r}: give (size, low, high) as Iris does, or ([low,] high, size)")
        shape = _shape((size,))
        values = torch.randint(low, high, shape, generator=generator, dtype=dtype, device=self.get_device())
        return self._filled(shape, dtype, values)

    def arange(self, start=0, end=None, step=1, dtype=None, device=None, requires_grad=False, **unused):
        if end is None:
            start, end = 0, start
        values = torch.arange(start, end, step, dtype=dtype, device=self.get_device())
        return self._filled((values.numel(),), values.dtype, values).requires_grad_(requires_grad)

    def linspace(self, start, end, steps, dtype=None, device=None, **unused):
        values = torch.linspace(start, end, steps, dtype=dtype or torch.get_default_dtype(), device=self.get_device())
        return self._filled((values.numel(),), values.dtype, values)

    def deallocate(self, pointer):
        """Iris frees nothing either: the heap is handed out again by the next ``iris.iris()``."""


def iris(heap_size=1 << 30):
    """This rank's :class:`Iris` (Iris: ``iris.iris(heap_size)``)."""
    return Iris(heap_size)


def memset_tensor(tensor, value):
    """Fill a contiguous int32 tensor with ``value``."""
    if tensor.dtype != torch.int32 or not tensor.is_contiguous():
        raise UsageError(f"memset_tensor takes a contiguous int32 tensor, got {tensor.dtype}"
                         f"{'' if tensor.is_contiguous() else ' (not contiguous)'}")
    tensor.fill_(value)
    return tensor


def _timer(device):
    """(start, stop -> ms) around a piece of work: CUDA events on a GPU; on cpu the interpreter runs each
    kernel to the end before the launch returns, so the host clock is the time the work took."""
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return begin.record, lambda: (end.record(), end.synchronize(), begin.elapsed_time(end))[2]
    mark = [0.0]
    return lambda: mark.__setitem__(0, time.perf_counter()), lambda: (time.perf_counter() - mark[0]) * 1e3


def do_bench(fn, barrier_fn=lambda: None, preamble_fn=lambda: None, n_warmup=25, n_repeat=100, quantiles=None,
             return_mode="mean"):
    """Time ``fn`` in ms as Iris's ``do_bench`` does: every repetition starts after ``barrier_fn`` (and
    ``preamble_fn``); the result is the mean (or ``return_mode`` min / max / median / all, or the given
    ``quantiles``) of ``n_repeat`` timings after ``n_warmup`` untimed runs."""
    device = _rank_heap.arena.device if _rank_heap is not None else torch.device("cpu")
    barrier_fn()
    preamble_fn()
    fn()
    barrier_fn()
    for _ in range(n_warmup):
        barrier_fn()
        preamble_fn()
        barrier_fn()
        fn()
    times = []
    for _ in range(n_repeat):
        barrier_fn()
        preamble_fn()
        barrier_fn()
        start, stop = _timer(device)
        start()
        fn()
        times.append(stop())
    barrier_fn()
    if quantiles is not None:
        ordered = sorted(times)
        picks = [ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] for q in quantiles]
        return picks[0] if len(picks) == 1 else picks
    summaries = {"mean": statistics.mean, "min": min, "max": max, "median": statistics.median, "all": list}
    if return_mode not in summaries:
        raise UsageError(f"return_mode={return_mode!r}: use one of {', '.join(summaries)}")
    return summaries[return_mode](times)
