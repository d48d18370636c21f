"""The ``iris`` module that Iris programs import on gemmar's ranks, written from Iris's public API.

``gemmar run -r N script.py``, ``Cluster.run_script`` and ``%%px`` cells (after ``Cluster.activate()``) make
``import iris`` give this module on every rank (``gemmar/iris/hook.py``), and ``iris.device.utils``,
``iris.hip``, ``iris.ccl``, ``iris.ops`` its submodules, so that a program written for Iris runs unchanged
on CPU ranks (the Triton interpreter over shared memory) or on NVIDIA GPUs.

Host side: :func:`iris` returns an :class:`Iris` over this rank's symmetric heap (the one gemmar built when
the rank started; ``--heap_size``) with today's Iris methods (``info``/``debug``/``warning``/``error``,
``broadcast(value, src)``, ``barrier(stream, group)``, ``get_device_context``, ``ccl``, ``ops``,
``tracing``, the allocators) and the older names (``log``, ``log_stats``, ``log_debug``,
``broadcast(value, source_rank)``). Device side: gemmar's device API with Iris's argument order and keywords,
and ``DeviceContext`` (``gemmar/iris/device.py``).

What differs from Iris, on purpose:

- the heap is the rank's gemmar heap: ``iris.iris(heap_size)`` asking for more than it has gets it anyway,
  with one line saying so; an allocation that does not fit is refused in one line. Each call of
  ``iris.iris`` hands the heap out afresh (re-running a notebook's setup cell reuses the memory instead of
  running out of it): tensors from an earlier call share memory with the new ones. A program's tensors come
  from the heap's end and are free again when it ends, so that gemmar's own runs on the same ranks (which
  hand out from the start) stay symmetric whatever the program allocated on which rank.
- ``wall_clock_rate`` and ``iris.hip.get_wall_clock_rate`` are the rate of gemmar's ``now()`` (ns: 1e6 kHz),
  the clock ``read_realtime`` reads here.
- ``as_symmetric`` (which needs Iris's vmem allocator to map a tensor's own memory into the heap) is refused
  in one line: gemmar's heaps are fixed arenas.
"""

import logging
import os
import pickle
import statistics
import time
import weakref

import numpy as np
import torch
import triton
import triton.language as tl

from ..errors import UsageError
from ..kernels.device import get, register_heap_bases
from ..runtime.heap import HEADER_BYTES, size_text
from ..programs import host_calls
from . import ccl, device, hip, ops, this_rank, tracing  # noqa: F401 - iris.ccl, iris.ops, ...: Iris's layout
from .device import (Context, DeviceContext, atomic_add, atomic_and, atomic_cas, atomic_max,  # noqa: F401
                     atomic_min, atomic_or, atomic_sub, atomic_xchg, atomic_xor, copy, load, put, store, translate)
from .device import TraceEvent  # noqa: F401
from .log_format import iris_logger
from .tensors import IrisRefusal, TensorCreation, is_valid_device  # noqa: F401 - iris.tensor_creation
from .tiles import Tile, TileView, TensorView, make_tensor_view  # noqa: F401 - Iris's tile API

__all__ = ["Iris", "iris", "do_bench", "memset_tensor", "DeviceContext", "Context", "TraceEvent", "translate", "load",
           "store", "copy", "get", "put", "atomic_add", "atomic_sub", "atomic_cas", "atomic_xchg", "atomic_min",
           "atomic_max", "atomic_and", "atomic_or", "atomic_xor", "ccl", "ops", "hip", "device", "tracing",
           "set_logger_level", "logger", "DEBUG", "INFO", "WARNING", "ERROR", "get_device_id_for_rank",
           "is_simulation_env", "Tile", "TileView", "TensorView", "make_tensor_view"]

# Iris's logger levels; IRIS_LOG_LEVEL picks the level at start, set_logger_level later.
DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
logger = iris_logger(getattr(logging, os.environ.get("IRIS_LOG_LEVEL", "").upper(), None) or
                     (DEBUG if os.environ.get("IRIS_DEBUG") else INFO))


def set_logger_level(level):
    logger.setLevel(level)


@triton.jit
def _fetch_from(buffer, source_rank, my_rank, heap_bases, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        get(buffer + offsets, buffer + offsets, my_rank, source_rank, heap_bases, mask=offsets < n)


class Iris(TensorCreation):
    """This rank's view of the symmetric heap, with Iris's host methods."""

    def __init__(self, heap_size=1 << 30, **unused):
        self._heap = this_rank.rank_heap()
        self.cur_rank, self.num_ranks = self._heap.rank, self._heap.world_size
        usable = self._heap.size - HEADER_BYTES
        if heap_size > self._heap.size and self.cur_rank == 0:
            self.info(f"iris.iris(heap_size={size_text(heap_size)}): each rank's heap is {size_text(self._heap.size)} "
                      f"(gemmar run --heap_size); allocations past that are refused")
        # Iris's constructor is collective (its ranks exchange heap bases): every rank meets here too, so that no
        # rank hands its heap out afresh while a peer still works on the tensors of the last iris.iris(), and every
        # rank starts on what follows together (Iris's own tests fill a buffer and launch a kernel that reads a
        # peer's with no barrier between: a race whose window this keeps as short as on a GPU).
        self._heap.barrier()
        self._heap.release_program_memory()   # hand the heap out afresh (see the module's docstring)
        self.heap_size = usable
        self.ccl = ccl.Collectives(self)
        self.ops = ops.FusedOps(self)
        self.tracing = tracing.Tracing(self)
        self._device_context = None
        self._device_barrier_state = {}
        self._said = set()   # info_once's messages

    # -- who and where --------------------------------------------------------------------------------
    def get_rank(self):
        return self.cur_rank

    def get_num_ranks(self):
        return self.num_ranks

    def get_device(self):
        return self._heap.arena.device

    def get_device_id(self):
        return get_device_id_for_rank(self.cur_rank)

    def get_cu_count(self):
        """The GPU's multiprocessors; on the cpu backend the machine's cores."""
        return hip.get_cu_count(self.get_device_id())

    def get_num_xcc(self):
        return 1

    def get_heap_bases(self):
        return self._heap.heap_bases

    def get_device_context(self):
        """The int64 tensor ``DeviceContext.initialize`` reads: ``[rank, world_size, heap bases..., max_events,
        counters, events]`` (the last three: the trace buffer of ``tracing.enable()``, 0 without one)."""
        if self._device_context is None:
            ends = torch.tensor([self.cur_rank, self.num_ranks], dtype=torch.int64, device=self.get_device())
            self._device_context = torch.cat([ends, self._heap.heap_bases, ends.new_zeros(tracing.CONTEXT_TAIL)])
            # (its heap bases, from the third word on, checked under the interpreter as the heap's own are)
            weakref.finalize(self._device_context, register_heap_bases(self._device_context.data_ptr() + 16,
                                                                       self.cur_rank, self.num_ranks))
            if self.tracing.enabled:
                self.tracing._point_context()
        return self._device_context

    def wall_clock_rate(self, rank=None):
        """kHz of the clock gemmar's kernels read (``now()``, in ns)."""
        return hip.get_wall_clock_rate(rank)

    # -- logging (gemmar run and %%px already say which rank a line comes from) ------------------------
    def _log(self, level, message):
        if logger.isEnabledFor(level):
            prefix = "" if level == INFO or level == DEBUG else f"{logging.getLevelName(level)}: "
            print(f"[Iris] {prefix}{message}", flush=True)

    def debug(self, message):
        self._log(DEBUG, message)

    def info(self, message):
        self._log(INFO, message)

    def warning(self, message):
        self._log(WARNING, message)

    def error(self, message):
        self._log(ERROR, message)

    def info_once(self, message):
        """``info`` from rank 0, once per distinct message (what ``ccl`` and ``ops`` ran, and why)."""
        if message not in self._said and self.cur_rank == 0:
            self.info(message)
        self._said.add(message)

    log = log_stats = info           # the 3b4c197-era names
    log_debug = debug

    # -- collectives ----------------------------------------------------------------------------------
    def barrier(self, stream=None, group=None):
        """Every rank's device work done, then every rank meets (a rank that never comes: DeadlockError).
        ``group``: only the whole world (gemmar's ranks meet on the heap)."""
        self._whole_world(group, "barrier")
        if stream is not None:
            stream.synchronize()
        self._heap.barrier()

    def device_barrier(self, group=None):
        """Iris's graph-capturable barrier; here the same barrier kernel as :meth:`barrier` (on the cpu backend,
        inside a ``torch.cuda.graph`` capture, recorded for the replays: ``host_calls.CpuGraph``)."""
        self._whole_world(group, "device_barrier")
        if self._heap.backend == "cpu" and host_calls.CpuGraph.record(self._heap.barrier):
            return
        self._heap.barrier()
        # Iris keeps its barrier's flags here, one tensor a group, made once and reused
        self._device_barrier_state.setdefault(group, self._heap._barrier_counter)

    def _whole_world(self, group, what):
        if group is None:
            return
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size(group) == self.num_ranks:
            return
        raise UsageError(f"{what}(group=...): gemmar's iris meets all {self.num_ranks} ranks at once; a group of "
                         f"some of them is not supported: use group=None")

    def broadcast(self, value, src=None, source_rank=None):
        """``src``'s value on every rank, through the symmetric heap. As in Iris, tensors, numpy arrays and
        numeric lists come back as numpy arrays, anything else as the object it was (pickled)."""
        src = src if src is not None else source_rank if source_rank is not None else 0
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.num_ranks:
            raise UsageError(f"broadcast src={src!r}: use a rank from 0 to {self.num_ranks - 1}")
        payload = b""
        if self.cur_rank == src:
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().numpy() if value.dtype != torch.bfloat16 else \
                    value.detach().float().cpu().numpy()
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) and
                                                                    not isinstance(v, bool) for v in value):
                value = np.asarray(value)
            try:
                payload = pickle.dumps(value)
            except Exception as e:  # noqa: BLE001 - whatever cannot be pickled, said in one line
                raise UsageError(f"broadcast({type(value).__name__}): cannot send it to the other ranks ({e})") \
                    from None
        length = int.from_bytes(self._broadcast_bytes(len(payload).to_bytes(8, "little"), 8, src), "little")
        return pickle.loads(self._broadcast_bytes(payload, length, src)) if length else None

    def _broadcast_bytes(self, data, length, src):
        """``length`` bytes of ``data`` from rank ``src`` to every rank."""
        heap = self._heap
        with heap.scope():
            buffer = heap.zeros(max(length, 1), torch.uint8)
            if self.cur_rank == src:
                buffer[:length].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            heap.barrier()
            if self.cur_rank != src:
                with heap.on_stream():
                    _fetch_from[(1,)](buffer, src, self.cur_rank, heap.heap_bases, length, 1024)
            heap.barrier()   # every rank has read it before the source reuses the memory
            return bytes(buffer[:length].cpu().numpy())

def iris(heap_size=1 << 30, **unused):
    """This rank's :class:`Iris` (Iris: ``iris.iris(heap_size)``)."""
    return Iris(heap_size)


def get_device_id_for_rank(rank, gpus_per_node=None):
    """The device a rank uses: gemmar already placed each rank (``gemmar run``), so its own device."""
    device = this_rank.rank_heap().arena.device
    return (device.index or 0) if device.type == "cuda" else 0


def is_simulation_env():
    return False


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
    device = this_rank.heap.arena.device if this_rank.heap is not None else torch.device("cpu")
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
