"""Recording every symmetric-heap access of a CPU rank, in one order shared by all ranks.

Under the Triton interpreter every ``tl.load``, ``tl.store`` and atomic ends in a method of the
interpreter's builder, with the addresses as a numpy array. :func:`install` has those methods wrapped wherever
gemmar runs kernels (the sanitizer's slot of the interpreter's patches, kernels/triton_support.py); while a
:class:`Recorder` is active they

- check the addresses against the heaps and their allocations *before* the access runs, and raise
  :class:`~gemmar.errors.HeapBoundsError` naming the rank, program, line and buffer (an access outside
  every heap is not the heap's business and runs untouched);
- run the access while holding one lock shared by every rank of the cluster, and number it from one
  counter shared by them all. So the numbering is the order in which the memory saw the accesses: a read
  read what the last earlier-numbered write to its address wrote, and the analysis (``order.py``) needs no
  guesswork about which release an acquire saw.

A kernel call is bracketed by start and end records (with the stream it ran on, which gemmar's launcher
names), so that the analysis knows which programs ran concurrently. Repeated polls of a flag by one program
are kept once: they order nothing and race with nothing the first poll does not.
"""

import fcntl
import mmap
import os
import sys
import sysconfig
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack, _pop_mode, _push_mode

from ..errors import HeapBoundsError
from ..kernels.device import kernel_line, library_folders, passes_through, place

UNNAMED = "heap tensor at byte"   # (the heap's name for an allocation nobody named)
ARTICLED = {"read": "a read", "write": "a write", "rmw": "an atomic", "access": "an access"}
BASES_GUARD = 64   # int64s of zeros on each side of a cpu heap's heap_bases table (runtime/heap/cpu.py)
OWNER_SHIFT = 40          # a location: owner rank << 40 | byte offset in the owner's heap
SEMS = {"ACQUIRE": "acquire", "RELEASE": "release", "ACQUIRE_RELEASE": "acq_rel", "RELAXED": "relaxed"}
SCOPES = {"GPU": "gpu", "CTA": "cta", "SYSTEM": "sys"}
RMW_NAMES = {"ADD": "add", "FADD": "add", "AND": "and", "OR": "or", "XOR": "xor", "XCHG": "xchg", "MAX": "max",
             "MIN": "min", "UMAX": "max", "UMIN": "min"}

DTYPE_SIZES = {"bfloat16": "float16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "bool": "bool"}
ACTIVE = None             # the Recorder of this process while a sanitized run records, else None
_installed = False
MAX_RANGES = 4096         # a host write to a strided tensor: its contiguous runs up to this many, else its span
NOT_A_DATA_WRITE = ("set_", "resize_", "resize_as_")   # (aten ops that change a tensor's metadata, not its bytes)


def element_text(label, byte):
    """(name, shape, dtype) and a byte offset into it -> ``partials[3, 17]`` (or ``+byte`` past whole elements)."""
    name, shape, dtype = label
    size = np.dtype(DTYPE_SIZES.get(dtype, dtype)).itemsize if dtype in DTYPE_SIZES or hasattr(np, dtype) else 1
    index, rest = divmod(int(byte), size)
    digits = []
    for extent in reversed(shape[1:]):
        index, digit = divmod(index, extent)
        digits.append(digit)
    text = f"{name}[{', '.join(str(d) for d in [index] + digits[::-1])}]"
    return text + (f" (+{rest} bytes)" if rest else "")


class Recorder:
    """One rank's record of a sanitized run. ``heap``: the rank's SymmetricHeap (cpu backend)."""

    def __init__(self, heap, sync_path):
        self.rank, self.world_size = heap.rank, heap.world_size
        self.heap = heap
        self.bases = np.array(heap.heap_bases.tolist(), dtype=np.int64)
        self.heap_size = heap.size
        self.bases_ptr = heap.heap_bases.data_ptr()
        fd = os.open(sync_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, max(os.fstat(fd).st_size, 8))
            self._sync_fd, self._map = fd, mmap.mmap(fd, 8)
        except Exception:
            os.close(fd)
            raise
        self._counter = np.frombuffer(self._map, dtype=np.int64, count=1)
        self.events = []          # tuples, see _access / kernel_start
        self.kernels = 0          # kernel calls so far on this rank
        self.kernel = None        # (index, name, grid) of the running kernel call
        self.stream = "main"      # the stream gemmar's launcher says the next kernel runs on
        self._polls = {}          # program -> signatures of relaxed reads since its last other access
        self._arguments = {}      # (kernel, allocation start) -> the kernel argument that points there
        self._translations = {}   # program -> the ranks of its last heap_bases reads (a translate's from, to)

    # -- the shared order -----------------------------------------------------------------------------
    def _numbered(self, run):
        fcntl.flock(self._sync_fd, fcntl.LOCK_EX)
        try:
            out = run()
            self._counter[0] += 1
            return out, int(self._counter[0])
        finally:
            fcntl.flock(self._sync_fd, fcntl.LOCK_UN)

    def host(self, kind, **details):
        """A host event in the shared order: ``join`` (a stream waits for another stream or an event),
        ``record`` (an event on a stream), ``sync`` (the host waits for its streams, a stream or an event)."""
        _, seq = self._numbered(lambda: None)
        self.events.append(("host", seq, kind, details))

    def on_heap(self, tensor):
        """The rank whose heap holds ``tensor``'s first byte, or None."""
        # (a sparse or storage-less tensor has no data pointer: never heap memory)
        if tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.numel() == 0:
            return None
        try:
            pointer = tensor.data_ptr()
        except RuntimeError:
            return None
        inside = np.flatnonzero((pointer >= self.bases) & (pointer < self.bases + self.heap_size))
        return int(inside[0]) if inside.size else None

    def host_write(self, tensors, op, run):
        """Run a torch op of this rank's host that writes ``tensors`` (each on a heap), numbered like a kernel's
        access, and record one ("host write", ...) per tensor: its byte ranges as location keys, the program's
        line, the buffer its first byte is in, and the stream it runs on (torch orders it there on a GPU)."""
        where = host_line()
        out, seq = self._numbered(run)
        starts, ends, labels = self.heap.allocation_table()
        for tensor in tensors:
            owner = self.on_heap(tensor)
            lo, hi = _byte_ranges(tensor)
            lo, hi = lo - int(self.bases[owner]), hi - int(self.bases[owner])
            i = int(np.searchsorted(starts, lo[0], side="right")) - 1
            buffer = (labels[i] + (int(starts[i]),) if i >= 0 and lo[0] < ends[i] else
                      ("heap", (self.heap_size,), "uint8", 0))
            self.events.append(("host write", seq, op, (owner << OWNER_SHIFT) | lo, (owner << OWNER_SHIFT) | hi, where,
                                buffer, owner, self.stream, time.monotonic_ns()))
        return out

    def kernel_start(self, name, grid):
        self.kernels += 1
        self.kernel = (self.kernels, name, tuple(grid) + (1,) * (3 - len(grid)))
        self._polls.clear()
        _, seq = self._numbered(lambda: None)
        self.events.append(("start", seq, self.kernels, name, self.stream))

    def kernel_end(self):
        _, seq = self._numbered(lambda: None)
        self.events.append(("end", seq, self.kernel[0]))
        self.kernel = None

    # -- accesses -------------------------------------------------------------------------------------
    def _program(self, builder):
        x, y, z = builder.grid_idx
        gx, gy, _ = self.kernel[2]
        return x + gx * (y + gy * z)

    def access(self, builder, kind, ptrs, mask, run, atomic, sem=None, scope=None, op=None, written=None):
        """Check, run (numbered) and record one memory operation of the running kernel; returns its result."""
        addresses = np.asarray(ptrs.data, dtype=np.uint64).reshape(-1)
        if mask is not None:
            addresses = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).reshape(-1)]
        if self.kernel is None:
            return run()
        program = self._program(builder)
        if addresses.size == 0:   # (all masked off: a translated pointer used by nothing)
            self._translations.pop(program, None)
            return run()
        addresses = addresses.astype(np.int64)
        asked = self._check_rank_asked(addresses)
        if asked is not None:   # translate reads heap_bases[from_rank], then heap_bases[to_rank]
            self._translations[program] = (self._translations.get(program, ()) + (asked,))[-2:]
            return run()
        translation = self._translations.pop(program, None)
        owners = self._owners(addresses, kind)
        if owners is None:
            if translation is not None and len(translation) == 2:
                self._wild(addresses, kind, program, translation)
            return run()    # not on any heap: A, B, the trace, a program's own tensors
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        where = kernel_line()
        offsets = addresses - self.bases[owners]
        buffer = self._buffer(owners, offsets, size, program, where, kind)
        keys = np.unique((owners.astype(np.int64) << OWNER_SHIFT) | offsets)
        relaxed_read = kind == "read" and atomic and sem in (None, "relaxed")
        if relaxed_read:
            signature = (keys[0], keys.size, where)
            seen = self._polls.setdefault(program, set())
            if signature in seen:
                return run()
            seen.add(signature)
        else:
            self._polls.pop(program, None)
        out, seq = self._numbered(run)
        # An atomic's first lane: the value it saw and the one it gave (for the reports).
        values = (_first(out), _first(written)) if kind == "rmw" else None
        # (the time, on the clock the trace uses under the interpreter, to draw the access on the Gantt chart)
        self.events.append(("access", seq, self.kernel[0], program, kind, atomic, sem, scope, op, keys, size,
                            where, buffer, int(owners[0]), time.monotonic_ns(), values))
        return out

    def _check_rank_asked(self, addresses):
        """The rank a read of the heap_bases table asks for (None when the access is not one). The device API
        reads heap_bases[rank] for every translation: a rank outside the world shows up as a read just past (or
        before) that table, before the translated address can crash the process."""
        index = (addresses - self.bases_ptr) // 8
        near = (addresses >= self.bases_ptr - 8 * BASES_GUARD) & \
            (addresses < self.bases_ptr + 8 * (self.world_size + BASES_GUARD))
        if not near.any():
            return None
        bad = near & ((index < 0) | (index >= self.world_size))
        if bad.any():
            raise HeapBoundsError(
                f"rank {self.rank}, program {self._program(_builder())} asked for rank {int(index[bad][0])} at "
                f"{place(kernel_line())}: ranks are 0 to {self.world_size - 1} (world_size={self.world_size})")
        return int(index[0]) if near.all() and addresses.size == 1 else None

    def _wild(self, addresses, kind, program, translation):
        """A write through a translated pointer that lands on no heap: the pointer was not in the heap of the
        rank it was translated from (from_rank and to_rank swapped, or a pointer that is not a heap tensor).
        Stopped here: the write would land in whatever memory is there, or crash the process."""
        from_rank, to_rank = translation
        where = place(kernel_line())
        original = int(addresses[0]) - int(self.bases[to_rank] - self.bases[from_rank])
        offsets = original - self.bases
        inside = np.flatnonzero((offsets >= 0) & (offsets < self.heap_size))
        heap = f"in rank {int(inside[0])}'s heap" if inside.size else "on no rank's heap"
        hint = (f": the caller is rank {self.rank}, so from_rank must be {self.rank} (data flows from from_rank to "
                f"to_rank)" if inside.size and int(inside[0]) == self.rank != from_rank else
                ": translate a pointer into a tensor of the symmetric heap")
        raise HeapBoundsError(
            f"rank {self.rank}, program {program}: {ARTICLED[kind]} at {where} translates a "
            f"pointer from rank {from_rank} to rank {to_rank}, but the pointer is {heap}, not rank {from_rank}'s, "
            f"so the address lands on no heap{hint}")

    def _owners(self, addresses, kind):
        """The rank whose heap holds each address; None when none is on a heap. A mix is a bounds error."""
        offsets = addresses[:, None] - self.bases[None, :]
        inside = (offsets >= 0) & (offsets < self.heap_size)
        on_heap = inside.any(axis=1)
        if not on_heap.any():
            return None
        if not on_heap.all():
            first = int(np.argmax(on_heap))
            owner = int(np.argmax(inside[first]))
            stray = int(addresses[~on_heap][0]) - int(self.bases[owner])
            raise HeapBoundsError(self._bounds_text(kind, owner, int(offsets[first, owner]), stray,
                                                    "outside every rank's heap"))
        return np.argmax(inside, axis=1)

    def _buffer(self, owners, offsets, size, program, where, kind):
        """(name, shape, dtype, start byte) of the one allocation the access falls in; else HeapBoundsError."""
        starts, ends, labels = self.heap.allocation_table()
        index = np.searchsorted(starts, offsets, side="right") - 1
        outside = (index < 0) | (offsets + size > ends[np.maximum(index, 0)])
        inside = np.flatnonzero(~outside)
        anchor = int(inside[0]) if inside.size else 0
        wrong = outside | (index != index[anchor]) | (owners != owners[anchor])
        if wrong.any():
            bad = int(np.argmax(wrong))
            problem = ("in no buffer" if outside[bad] else
                       f"in {self.heap.describe_offset(int(offsets[bad]))}, another buffer" if index[bad] != index[anchor]
                       else f"on rank {int(owners[bad])}'s heap, not rank {int(owners[anchor])}'s")
            raise HeapBoundsError(self._bounds_text(kind, int(owners[anchor]), int(offsets[anchor]), int(offsets[bad]),
                                                    problem, program, where, size))
        first = int(index[anchor])
        label = labels[first]
        if label[0].startswith(UNNAMED):
            key = (self.kernel[1], int(starts[first]))
            if key not in self._arguments:
                self._arguments[key] = _argument_named(int(self.bases[self.rank]) + int(starts[first]))
            if self._arguments[key]:
                label = (self._arguments[key],) + label[1:]
        return label + (int(starts[first]),)

    def _bounds_text(self, kind, owner, anchor, stray, problem, program=None, where=None, size=1):
        """One line: who (rank, program, line) reached which element past which buffer, and where that is."""
        at = place(where or kernel_line())
        program = self._program(_builder()) if program is None else program
        starts, ends, labels = self.heap.allocation_table()
        i = int(np.searchsorted(starts, anchor, side="right")) - 1
        if i < 0 or anchor >= ends[i]:
            return (f"rank {self.rank}, program {program}: {ARTICLED[kind]} at {at} reaches byte "
                    f"{stray} of rank {owner}'s heap, {problem}")
        name, shape, dtype = labels[i]
        if name.startswith(UNNAMED):
            name = _argument_named(int(self.bases[self.rank]) + int(starts[i])) or name
        element = (stray - int(starts[i])) // size
        count = (int(ends[i]) - int(starts[i])) // size
        # For a matrix, the row and column too: a row past the last one is an edge tile's mask (rows or columns).
        where_in = (f" (row {element // shape[1]}, column {element % shape[1]}; rows are 0 to {shape[0] - 1})"
                    if len(shape) == 2 and shape[1] and element >= 0 else "")
        return (f"rank {self.rank}, program {program}: {ARTICLED[kind]} at {at} reaches element "
                f"{element}{where_in} of {name} ({dtype}{list(shape)}, {count} elements) on rank {owner}'s heap, "
                f"{'past its end' if element >= count else 'before its start' if element < 0 else 'inside it'}: "
                f"byte {stray} is {problem}")

    def take(self):
        """This rank's record, for the analysis: plain Python and numpy, picklable."""
        return dict(rank=self.rank, world_size=self.world_size, events=self.events)

    def close(self):
        self._counter = None
        self._map.close()
        os.close(self._sync_fd)


def _byte_ranges(tensor):
    """A tensor's bytes as sorted, disjoint [lo, hi) address ranges: one for a contiguous tensor, one per contiguous
    run of a strided one (up to MAX_RANGES runs), else the whole span from its first to its last byte (which also
    covers the gaps between its runs: a host write to a large strided view is taken to write them too)."""
    size, start = tensor.element_size(), tensor.data_ptr()
    shape, strides, run = list(tensor.shape), [s * size for s in tensor.stride()], size
    while shape and (shape[-1] == 1 or strides[-1] == run):   # (the innermost dimensions that are one run)
        run *= shape.pop()
        strides.pop()
    if int(np.prod(shape)) > MAX_RANGES:
        last = sum((n - 1) * s for n, s in zip(shape, strides))
        return np.array([start], np.int64), np.array([start + last + run], np.int64)
    lo = np.zeros(1, np.int64)
    for n, stride in zip(shape, strides):
        lo = (lo[:, None] + np.arange(n, dtype=np.int64) * stride).reshape(-1)
    lo = np.unique(lo) + start
    hi = lo + run
    if lo.size > 1:   # runs that touch or overlap (a zero stride) are one
        joined = np.concatenate([[False], lo[1:] <= np.maximum.accumulate(hi)[:-1]])
        first = np.flatnonzero(~joined)
        hi = np.maximum.reduceat(hi, first)
        lo = lo[first]
    return lo, hi


_LIBRARIES = library_folders(os.path.dirname(os.path.abspath(torch.__file__)))
_HOST_PLUMBING = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep,
                  os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "heap") + os.sep,
                  os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep)


def host_line():
    """(file, line, function) of the program's line that made a host write: the innermost frame outside Python's,
    torch's, gemmar's and the installed libraries' files and Iris's own package (a real Iris's ``shmem.zeros`` is
    named where the program calls it). A write gemmar makes for itself: its innermost gemmar line outside the heap."""
    frame, fallback = sys._getframe(1), None
    while frame is not None:
        file = frame.f_code.co_filename
        module = frame.f_globals.get("__name__") or ""
        if not (os.path.realpath(file).startswith(_LIBRARIES) or file.startswith("<frozen") or
                module == "iris" or module.startswith("iris.")):
            return (file, frame.f_lineno, frame.f_code.co_name)
        if fallback is None and not os.path.realpath(file).startswith(_HOST_PLUMBING):
            fallback = (file, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return fallback or ("?", 0, "?")


_WRITES = {}   # aten op -> ((position, name) of each argument it writes)


def _written(func, args, kwargs):
    """The tensors an aten op writes, from its schema (``Tensor(a!)``): ``self`` of an in-place op, ``out=``."""
    where = _WRITES.get(func)
    if where is None:
        skip = func.namespace != "aten" or torch.Tag.inplace_view in func.tags or \
            func.overloadpacket.__name__ in NOT_A_DATA_WRITE
        where = _WRITES[func] = () if skip else tuple(
            (i, a.name) for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
    found = []
    for i, name in where:
        value = args[i] if i < len(args) else kwargs.get(name)
        found.extend(value if isinstance(value, (list, tuple)) else [value])
    return [t for t in found if isinstance(t, torch.Tensor)]


class _HostWrites(TorchDispatchMode):
    """Sees every aten op of this rank's host thread while a Recorder records (c10d's collectives are not aten ops:
    not recorded, and never run holding the shared lock, which a peer waiting in the same collective may need)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = ACTIVE
        if rec is None or rec.kernel is not None:   # (inside a kernel: the interpreter's own copies of its arguments)
            return func(*args, **kwargs)
        written = [t for t in _written(func, args, kwargs) if rec.on_heap(t) is not None]
        if not written:
            return func(*args, **kwargs)
        return rec.host_write(written, func.overloadpacket.__name__, lambda: func(*args, **kwargs))


_host_writes = None   # the mode, while it is on this thread's dispatch stack


def watch_host_writes():
    """Have this thread's torch ops that write a heap recorded (``_HostWrites``), until :func:`unwatch_host_writes`."""
    global _host_writes
    if _host_writes is None:
        _host_writes = _HostWrites()
        _push_mode(_host_writes)


def unwatch_host_writes():
    """Take the mode off the dispatch stack again (modes a program pushed above it stay, in their order)."""
    global _host_writes
    mode, _host_writes = _host_writes, None
    if mode is None or mode not in _get_current_dispatch_mode_stack():
        return
    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for top in reversed(above):
        _push_mode(top)


def _argument_named(address):
    """The name of the kernel argument (a pointer) whose value is ``address``: what the kernel calls a heap
    tensor that has no name of its own (an Iris program's). None when no argument points there."""
    frame = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return None
        if not passes_through(frame):
            for name, value in frame.f_locals.items():
                data = getattr(getattr(value, "handle", None), "data", None)
                dtype = getattr(value, "dtype", None)
                if data is not None and np.size(data) == 1 and getattr(dtype, "is_ptr", lambda: False)() and \
                        int(np.asarray(data).reshape(-1)[0]) == address:
                    return name
        frame = frame.f_back
    return None


def _first(handle):
    data = getattr(handle, "data", None)
    if data is None or np.size(data) == 0:
        return None
    value = np.asarray(data).reshape(-1)[0]
    return value.item() if hasattr(value, "item") else value


def _builder():
    from triton.runtime import interpreter

    return interpreter.interpreter_builder


def install():
    """Have the interpreter's memory operations and kernel calls recorded wherever gemmar runs kernels, from now
    on in this process: the sanitizer's slot of the interpreter's patches (kernels/triton_support.py, applied only
    inside its scope). A no-op while no Recorder is active."""
    global _installed
    if _installed:
        return
    from ..kernels.triton_support import subscribe

    subscribe("heap accesses recorded", _record_accesses)
    _installed = True


def _record_accesses(replace):
    """Wrap the interpreter builder's loads, stores and atomics, and every kernel call (``replace``: the owner's)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    original = {name: getattr(builder, name) for name in
                ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")}

    def masked_load(ptrs, mask, *rest):
        rec, run = ACTIVE, lambda: original["create_masked_load"](ptrs, mask, *rest)
        if rec is None:
            return run()
        return rec.access(builder, "read", ptrs, mask, run, atomic=bool(rest[-1]))

    def masked_store(ptrs, value, mask, *rest):
        rec, run = ACTIVE, lambda: original["create_masked_store"](ptrs, value, mask, *rest)
        if rec is None:
            return run()
        return rec.access(builder, "write", ptrs, mask, run, atomic=False)

    def atomic_rmw(rmw, ptr, val, mask, sem, scope):
        rec, run = ACTIVE, lambda: original["create_atomic_rmw"](rmw, ptr, val, mask, sem, scope)
        if rec is None:
            return run()
        return rec.access(builder, "rmw", ptr, mask, run, atomic=True, sem=SEMS.get(sem.name, sem.name),
                          scope=SCOPES.get(scope.name, scope.name), op=RMW_NAMES.get(rmw.name, rmw.name.lower()),
                          written=val)

    def atomic_cas(ptr, cmp, val, sem, scope):
        rec, run = ACTIVE, lambda: original["create_atomic_cas"](ptr, cmp, val, sem, scope)
        if rec is None:
            return run()
        return rec.access(builder, "rmw", ptr, None, run, atomic=True, sem=SEMS.get(sem.name, sem.name),
                          scope=SCOPES.get(scope.name, scope.name), op="cas", written=val)

    replace(builder, "create_masked_load", masked_load)
    replace(builder, "create_masked_store", masked_store)
    replace(builder, "create_atomic_rmw", atomic_rmw)
    replace(builder, "create_atomic_cas", atomic_cas)

    grid_call = interpreter.GridExecutor.__call__

    def call_with_record(self, *args, **kwargs):
        rec = ACTIVE
        if rec is None:
            return grid_call(self, *args, **kwargs)
        grid = self.grid
        if callable(grid):
            grid = _resolved_grid(self, grid, args, kwargs)
        rec.kernel_start(getattr(self.fn, "__name__", "kernel"), grid)
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            rec.kernel_end()

    replace(interpreter.GridExecutor, "__call__", call_with_record)


def _resolved_grid(executor, grid, args, kwargs):
    import inspect

    try:
        return tuple(grid(inspect.getcallargs(executor.fn, *args, **kwargs)))
    except Exception:  # noqa: BLE001 - a grid we cannot evaluate here: number programs by x alone
        return (1 << 30,)
