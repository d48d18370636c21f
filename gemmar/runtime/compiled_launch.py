"""A kernel launch prepared once and repeated cheaply: what keeps ranks that share a GPU starting together.

Ranks that share one GPU are launched one after another by one process, so the host time of a launch is
how far apart they start. Through Triton's dispatcher and torch's stream contexts a two_shot launch (two
kernels) cost hundreds of us of host time (docs/decisions.md, PreparedLaunch), and skipping only the
dispatcher saved little: the cost was spread over ~800 Python calls per launch (binding ~30 arguments, building the argument
tuples and tensor descriptors again, entering streams). :class:`PreparedLaunch` does all of that once, for
one kernel with fixed arguments; a later launch changes only the arguments the kernel does not specialise
on (``epoch``, ``parity``: Triton compiles those as plain integers, so any value runs the same compiled
kernel), or a tensor for another of the same dtype and alignment, and hands the compiled kernel its
arguments on its stream directly. Tensors reach it as their addresses, taken once: handed a tensor, Triton's
launcher calls its ``data_ptr`` and asks the driver whether that is a device pointer, and at few rows the
host's time per launch is what a launch takes.

The first launch goes through Triton as usual (which compiles, or finds the kernel it has). The interpreter
has no compiled kernels: there every launch goes through Triton.

A launch whose arguments are all the same as last time (a kernel that reads its launch number from the
device, as the standalone all-reduce does, or a fused kernel at one rank) can go further: :meth:`PreparedLaunch.replay` captures it once
in a CUDA graph and then launches it with one driver call (:class:`GraphLaunch`). Triton's launcher parses
every argument on every launch; at 1 MiB an all-reduce's GPU work is a few microseconds and that parsing
was most of its time.
"""

import ctypes
import inspect
import os
import warnings
import weakref

import torch

from ..kernels.triton_support import gemmar_interpreter

# The per-launch arguments a spec may name (``Launch.per_launch``), as functions of the launch count.
EPOCH_VALUES = {"epoch": lambda count: count, "parity": lambda count: count % 2}


class PreparedLaunch:
    """``kernel[grid](*args, **kwargs)`` on ``stream`` (a torch stream, or None on cpu), launched with the
    launch count, ``prepared.at(3)``, which sets the arguments named in ``per_launch`` (``EPOCH_VALUES``),
    and any argument whose value changed: ``prepared.at(3, x=y)``."""

    def __init__(self, kernel, grid, args, kwargs, stream=None, per_launch=()):
        self.kernel, self.grid, self.args, self.kwargs, self.stream = kernel, tuple(grid), args, kwargs, stream
        params = inspect.signature(kernel.fn).parameters   # (the interpreter's kernels have no .params)
        names = list(params)
        values = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
        values.update(zip(names, args))
        values.update((k, v) for k, v in kwargs.items() if k in params)
        self.values = [values[n] for n in names]     # every parameter in order, constexprs included
        self.index = {n: i for i, n in enumerate(names)}
        # Under the interpreter nothing is compiled, so any argument may change.
        self.free = {p.name for p in kernel.params if p.do_not_specialize} if hasattr(kernel, "params") else \
            set(names)
        fixed = [name for name in per_launch if name not in self.free]
        if fixed:
            raise ValueError(f"{kernel.__name__}: {fixed} change every launch, so the kernel must not specialise "
                             f"on them (do_not_specialize)")
        self.per_launch = [(self.index[name], EPOCH_VALUES[name]) for name in per_launch]
        self.launcher = None
        self.addresses = None   # self.values with each tensor as its address: what the compiled kernel is handed
        self.stream_handle = None
        self.graph = None       # a GraphLaunch of the launch as its arguments are now; False: none can be made

    def at(self, count, **changed):
        """Launch number ``count``: its per-launch arguments set from it, and any other argument given a new
        value (``x=...``)."""
        for name, value in changed.items():
            i = self.index[name]
            old = self.values[i]
            if value is old:
                continue
            # A specialised argument could need another compiled kernel; a tensor is specialised only on its
            # dtype and whether its address is a multiple of 16, so another one alike runs the same kernel.
            if name not in self.free and not _same_specialisation(old, value):
                raise ValueError(f"{self.kernel.__name__}: {name} is specialised on, so it cannot change here")
            self._set(i, value)
            self.graph = None
        for i, value_at in self.per_launch:
            self._set(i, value_at(count))
        if self.launcher is not None:
            self.launcher(*self.addresses, stream=self.stream_handle)
        else:
            self._first_launch()

    def replay(self):
        """The launch again with every argument as last time: through a CUDA graph, captured at the first
        replay after a first launch (which compiles), where one can be made (a compiled kernel with no per-launch
        arguments, on CUDA); else as :meth:`at` launches. Not for a kernel with per-launch arguments: those change every launch."""
        if self.per_launch:
            raise ValueError(f"{self.kernel.__name__}: its per-launch arguments change every launch: use at(count)")
        if USE_GRAPHS and self.launcher is not None:   # (captured after the first launch, which compiles)
            if self.graph is None:
                self.graph = self._capture()
            if self.graph:
                self.graph()
                return
        self.at(0)

    def _capture(self):
        if self.launcher is None or _driver() is None:
            return False
        try:
            return GraphLaunch(self)
        except Exception as e:   # (a kernel the driver will not capture still runs, as before)
            warnings.warn(f"{self.kernel.__name__}: launched without a CUDA graph, whose capture failed: {e}")
            return False

    def _set(self, i, value):
        self.values[i] = value
        if self.addresses is not None:
            self.addresses[i] = _address(value)

    def _first_launch(self):
        """Through Triton's dispatcher (every launch under the interpreter); on a GPU, keeps what it ran."""
        args = self.values[:len(self.args)]
        kwargs = {k: (self.values[self.index[k]] if k in self.index else v) for k, v in self.kwargs.items()}
        # (no stream: a cpu rank, whose kernels run on gemmar's interpreter, patched only inside its scope)
        with torch.cuda.stream(self.stream) if self.stream is not None else gemmar_interpreter():
            compiled = self.kernel[self.grid](*args, **kwargs)
        if self.stream is not None and compiled is not None:
            # What Triton's dispatcher hands the compiled kernel: every parameter, in order.
            self.launcher = compiled[self.grid + (1,) * (3 - len(self.grid))]
            self.addresses = [_address(value) for value in self.values]
            self.stream_handle = self.stream.cuda_stream


def _address(value):
    """A tensor's address (the launcher takes an integer as a pointer as it is); anything else unchanged. The
    tensor itself stays referenced in ``values``, so its memory stays allocated."""
    return value.data_ptr() if isinstance(value, torch.Tensor) else value


def _same_specialisation(old, new):
    return isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.dtype == new.dtype and \
        old.device == new.device and (old.data_ptr() % 16 == 0) == (new.data_ptr() % 16 == 0)


# Whether PreparedLaunch.replay may use CUDA graphs (GEMMAR_CUDA_GRAPHS=0: never): a graph's launch costs a
# fraction of Triton's launcher's host time, which decides small all-reduces (docs/decisions.md, CUDA graphs).
USE_GRAPHS = os.environ.get("GEMMAR_CUDA_GRAPHS", "1") != "0"

_DRIVER = []   # [the CUDA driver library with the few calls used here, or None where there is none]


def _driver():
    if not _DRIVER:
        lib = None
        if torch.version.cuda is not None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError:
                pass
        if lib is not None:
            ptr, out = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
            for name, argtypes in (("cuStreamBeginCapture_v2", [ptr, ctypes.c_int]),
                                   ("cuStreamEndCapture", [ptr, out]),
                                   ("cuGraphInstantiateWithFlags", [out, ptr, ctypes.c_ulonglong]),
                                   ("cuGraphLaunch", [ptr, ptr]), ("cuGraphExecDestroy", [ptr]),
                                   ("cuGraphDestroy", [ptr]), ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])):
                getattr(lib, name).argtypes = argtypes
                getattr(lib, name).restype = ctypes.c_int
        _DRIVER.append(lib)
    return _DRIVER[0]


def _check(result, what):
    if result:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {name.value.decode() if name.value else result}")


class GraphLaunch:
    """A prepared launch captured in a CUDA graph on its stream; calling it launches the graph there (one
    driver call). Capture does not run the kernel and synchronises nothing: ranks that share a GPU wait for
    each other inside their kernels, so a device-wide synchronise while one rank's kernel waits on another's
    not yet launched would never return."""

    RELAXED = 2   # CU_STREAM_CAPTURE_MODE_RELAXED: other threads' calls go on as usual during the capture

    def __init__(self, prepared):
        lib, stream = _driver(), ctypes.c_void_p(prepared.stream_handle)
        graph, graph_exec = ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib.cuStreamBeginCapture_v2(stream, self.RELAXED), "starting a CUDA graph capture")
        try:
            prepared.launcher(*prepared.addresses, stream=prepared.stream_handle)
        finally:
            _check(lib.cuStreamEndCapture(stream, ctypes.byref(graph)), "ending a CUDA graph capture")
        try:
            _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(graph_exec), graph, 0), "instantiating a CUDA graph")
        except RuntimeError:
            lib.cuGraphDestroy(graph)
            raise
        self.launch_graph, self.graph_exec, self.stream = lib.cuGraphLaunch, graph_exec, stream
        # Freed with this object (the driver's objects, not the tensors the graph reads: the prepared launch
        # holds those).
        weakref.finalize(self, _destroy_graph, lib, graph_exec, graph)

    def __call__(self):
        result = self.launch_graph(self.graph_exec, self.stream)
        if result:
            _check(result, "launching a CUDA graph")


def _destroy_graph(lib, graph_exec, graph):
    lib.cuGraphExecDestroy(graph_exec)
    lib.cuGraphDestroy(graph)
