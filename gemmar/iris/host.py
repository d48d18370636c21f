"""The ``iris`` module that Iris programs import on gemmar's ranks, written from Iris's public API.

``gemmar run -r N script.py``, ``Cluster.run_script`` and ``%%px`` cells (after ``Cluster.activate()``) make
``import iris`` give this module on every rank (``gemmar/iris/rank.py``), and ``iris.device.utils``,
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
import math
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
from . import ccl, device, hip, host_calls, ops, this_rank, tracing  # noqa: F401 - iris.ccl, iris.ops, ...: Iris's layout
from .device import (Context, DeviceContext, atomic_add, atomic_and, atomic_cas, atomic_max,  # noqa: F401
                     atomic_min, atomic_or, atomic_sub, atomic_xchg, atomic_xor, copy, load, put, store, translate)
from .device import TraceEvent  # noqa: F401
from .log_format import iris_logger
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


class IrisRefusal(UsageError, RuntimeError):
    """A call Iris itself refuses with a RuntimeError (a device that is not the heap's, an ``out=`` tensor that does
    not fit): one line, as a RuntimeError as in Iris."""


def _shape(size):
    """Iris's allocators take a shape as separate ints or as one tuple/list (nested ones are flattened)."""
    while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in size):
        raise UsageError(f"shape {size!r} is not allowed: use whole numbers >= 0")
    return tuple(size)


@triton.jit
def _fetch_from(buffer, source_rank, my_rank, heap_bases, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        get(buffer + offsets, buffer + offsets, my_rank, source_rank, heap_bases, mask=offsets < n)


class Iris:
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

    # -- allocators (every rank makes the same calls in the same order: same offsets everywhere) -------
    @property
    def device(self):
        """Iris's device string: the device of this rank's heap (``cuda:N``; ``cpu`` on the cpu backend)."""
        return str(self.get_device())

    @property
    def heap(self):
        """Iris's ``shmem.heap``: ``allocate(num_elements, dtype)`` from the symmetric heap."""
        return self

    def allocate(self, num_elements, dtype):
        try:
            return self._heap.empty((num_elements,), dtype, from_end=True)
        except UsageError:   # (the heap's own check; said here in the terms of gemmar run)
            nbytes = num_elements * torch.empty((), dtype=dtype).element_size()
            raise UsageError(f"the symmetric heap is full: {num_elements} x {dtype} needs {size_text(nbytes)} more "
                             f"than is left of the {size_text(self._heap.size)} each rank has; start the ranks with "
                             f"a larger --heap_size") from None

    def _check_device(self, device):
        """None, the heap's device, or (on a GPU) ``cuda`` for the current one; anything else is refused."""
        if device is None:
            return
        if self._heap.backend == "cpu":   # ("cuda" is this rank's device there, as everywhere in the program)
            device = host_calls._cpu_device(device)
        if is_valid_device(device, self.get_device()):
            return
        mine = self.get_device()
        raise IrisRefusal(f"device={str(device)!r}: Iris's tensors live in this rank's symmetric heap on {mine}; "
                          f"leave device out or pass {self.device!r}")

    def _create(self, shape, dtype, fill, device=None, layout=torch.strided, out=None, requires_grad=False,
                memory_format=torch.contiguous_format):
        """A heap tensor of ``shape`` (or ``out``, checked as Iris checks it), filled by ``fill(tensor)``."""
        self._check_device(device)
        if layout != torch.strided:
            raise UsageError(f"layout={layout}: tensors on the symmetric heap are dense; use torch.strided")
        dtype = dtype or torch.get_default_dtype()
        count = math.prod(shape)
        if out is not None:
            if out.numel() != count:
                raise IrisRefusal(f"The output tensor has {out.numel()} elements, but {count} are required")
            if out.dtype != dtype:
                raise IrisRefusal(f"The output tensor has dtype {out.dtype}, but {dtype} is required")
            if not self.is_symmetric(out):
                raise IrisRefusal("The output tensor is not on the symmetric heap: allocate it with this Iris "
                                  "instance (shmem.empty, shmem.heap.allocate)")
            tensor = out if tuple(out.shape) == tuple(shape) else out.view(shape)   # (Iris gives `out` itself back)
        else:
            flat = self.allocate(count, dtype)
            fits = {torch.channels_last: 4, torch.channels_last_3d: 5}.get(memory_format) == len(shape)
            if not fits:   # (a format for another number of dimensions leaves the tensor contiguous, as Iris does)
                tensor = flat.view(shape)
            else:   # channels_last & co: the same elements in the strides torch gives that format
                strides = torch.empty(shape, device="meta", memory_format=memory_format).stride()
                tensor = flat.as_strided(shape, strides)
        with torch.no_grad():
            fill(tensor)
        return tensor.requires_grad_(requires_grad)

    def empty(self, *size, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False,
              memory_format=torch.contiguous_format, **unused):
        return self._create(_shape(size), dtype, lambda t: None, device, layout, out, requires_grad, memory_format)

    def zeros(self, *size, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False, **unused):
        return self._create(_shape(size), dtype, torch.Tensor.zero_, device, layout, out, requires_grad)

    def ones(self, *size, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False, **unused):
        return self._create(_shape(size), dtype, lambda t: t.fill_(1), device, layout, out, requires_grad)

    def full(self, size, fill_value, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False,
             **unused):
        """As ``torch.full``: the dtype follows ``fill_value`` unless given."""
        dtype = dtype or torch.full((), fill_value).dtype
        return self._create(_shape((size,)), dtype, lambda t: t.fill_(fill_value), device, layout, out,
                            requires_grad)

    def zeros_like(self, tensor, dtype=None, device=None, layout=None, requires_grad=False,
                   memory_format=torch.preserve_format, **unused):
        if memory_format == torch.preserve_format:   # keep the input's strides where they are a known format
            memory_format = next((f for f in (torch.channels_last, torch.channels_last_3d)
                                  if tensor.dim() == (4 if f == torch.channels_last else 5) and
                                  tensor.is_contiguous(memory_format=f) and not tensor.is_contiguous()),
                                 torch.contiguous_format)
        return self._create(tuple(tensor.shape), dtype or tensor.dtype, torch.Tensor.zero_, device,
                            layout or tensor.layout, None, requires_grad, memory_format)

    def _random(self, size, dtype, draw, device, layout, out, requires_grad):
        shape = _shape(size)
        return self._create(shape, dtype, lambda t: t.copy_(draw(shape, dtype or torch.get_default_dtype())),
                            device, layout, out, requires_grad)

    def randn(self, *size, generator=None, dtype=None, device=None, layout=torch.strided, out=None,
              requires_grad=False, **unused):
        draw = lambda shape, dt: torch.randn(shape, generator=generator, dtype=dt, device=self.get_device())  # noqa
        return self._random(size, dtype, draw, device, layout, out, requires_grad)

    def rand(self, *size, generator=None, dtype=None, device=None, layout=torch.strided, out=None,
             requires_grad=False, **unused):
        draw = lambda shape, dt: torch.rand(shape, generator=generator, dtype=dt, device=self.get_device())  # noqa
        return self._random(size, dtype, draw, device, layout, out, requires_grad)

    def uniform(self, size, low=0.0, high=1.0, dtype=torch.float, **unused):
        return self._create(_shape((size,)), dtype, lambda t: t.uniform_(low, high))

    def randint(self, *args, dtype=None, generator=None, device=None, layout=torch.strided, out=None,
                requires_grad=False, **unused):
        """torch's ``randint([low,] high, size)`` (size a tuple), or Iris's older ``randint(size, low, high)``;
        int64 unless ``dtype`` says otherwise, as torch."""
        if len(args) in (2, 3) and isinstance(args[-1], (tuple, list, torch.Size)):
            low, high, size = args if len(args) == 3 else (0, *args)
        elif len(args) == 3:
            size, low, high = args
        else:
            raise UsageError(f"randint{args!r}: give ([low,] high, size) as torch does, or (size, low, high)")
        dtype = dtype or torch.int64
        draw = lambda shape, dt: torch.randint(low, high, shape, generator=generator, dtype=dt,  # noqa: E731
                                               device=self.get_device())
        return self._random((size,), dtype, draw, device, layout, out, requires_grad)

    def arange(self, start=0, end=None, step=1, dtype=None, device=None, layout=torch.strided, out=None,
               requires_grad=False, **unused):
        if end is None:
            start, end = 0, start
        if step == 0 or (end - start) * step < 0:
            raise UsageError(f"arange({start}, {end}, step={step}): the step must be non-zero and go from start "
                             f"towards end")
        values = torch.arange(start, end, step, dtype=dtype, device=self.get_device())
        return self._create((values.numel(),), values.dtype, lambda t: t.copy_(values), device, layout, out,
                            requires_grad)

    def linspace(self, start, end, steps, dtype=None, device=None, layout=torch.strided, out=None,
                 requires_grad=False, **unused):
        if isinstance(steps, (tuple, list, torch.Size)):   # (Iris takes a one-element shape too, nested or not)
            shape = _shape((steps,))
            steps = shape[0] if len(shape) == 1 else steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise UsageError(f"linspace steps={steps!r}: use a whole number >= 0")
        complex_ends = any(isinstance(v, complex) or (isinstance(v, torch.Tensor) and v.is_complex())
                           for v in (start, end))
        dtype = dtype or (torch.complex64 if complex_ends else torch.get_default_dtype())
        values = torch.linspace(start, end, steps, dtype=dtype, device=self.get_device())
        return self._create((steps,), dtype, lambda t: t.copy_(values), device, layout, out, requires_grad)

    def is_symmetric(self, tensor):
        """Whether ``tensor``'s memory lies in this rank's heap (so peers can reach it)."""
        arena = self._heap.arena
        # (an empty tensor's data_ptr() is 0: where it would start is its storage plus its offset)
        start = tensor.data_ptr() if tensor.numel() else \
            tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()
        # (the last element's end, whatever the strides)
        end = start + (sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride())) + 1) * tensor.element_size() \
            if tensor.numel() else start
        return tensor.device == arena.device and arena.data_ptr() <= start and end <= arena.data_ptr() + arena.numel()

    def as_symmetric(self, external_tensor):
        raise UsageError("as_symmetric: Iris maps a tensor's own memory into the heap with its vmem allocator; "
                         "gemmar's heaps are fixed arenas: allocate the tensor with shmem.empty/zeros and copy into it")

    def deallocate(self, pointer):
        """Iris frees nothing either: the heap is handed out again by the next ``iris.iris()``."""


def iris(heap_size=1 << 30, **unused):
    """This rank's :class:`Iris` (Iris: ``iris.iris(heap_size)``)."""
    return Iris(heap_size)


def get_device_id_for_rank(rank, gpus_per_node=None):
    """The device a rank uses: gemmar already placed each rank (``gemmar run``), so its own device."""
    device = this_rank.rank_heap().arena.device
    return (device.index or 0) if device.type == "cuda" else 0


def is_valid_device(device, iris_device):
    """Iris's ``tensor_creation.is_valid_device``: whether ``device`` names ``iris_device`` (None does; ``cuda``
    names the current GPU)."""
    if device is None:
        return True
    asked, mine = torch.device(device), torch.device(iris_device)
    return asked == mine or (asked.type == mine.type == "cuda" and asked.index is None)


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
