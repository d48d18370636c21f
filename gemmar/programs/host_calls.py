"""How the host calls of an Iris program are made to work on gemmar's ranks (``rank.py`` installs these).

Under the interpreter two things a GPU would let pass are said instead of crashing the run: a ``tl.assume``
that is false (a hint to the compiler, which Iris's GEMM examples get wrong for the first row of tiles:
``pid_m > 0``) is one warning naming the kernel line, and the run goes on as it would on a GPU; reading
compiled-kernel metadata (``n_regs``, ``n_spills``) from a launch is one line saying there is none.

On the cpu backend kernels run under the Triton interpreter, synchronously, on CPU tensors. What Iris
programs do with CUDA on the host becomes its CPU equivalent: ``device="cuda"`` (in torch's factory
functions, ``.to``, ``.cuda()``) means the CPU, ``torch.cuda.synchronize`` has nothing to wait for,
streams run their work in order on the one CPU "stream", events read the host clock (``elapsed_time``
in ms) and nvtx ranges mark nothing. Launch options that only AMD's compiler has (``waves_per_eu``,
``matrix_instr_nonkdim``, ``kpack``) are dropped, saying so once, wherever they do not apply.
"""

import contextlib
import functools
import os
import sys
import time
import traceback
import types

import torch

from .. import sanitizer
from ..errors import UsageError
from ..kernels.device import library_folders
from ..kernels.triton_support import subscribe
from ..runtime import rank as rank_runtime

AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


# -- the cpu backend: CUDA host calls as their CPU equivalents ------------------------------------------------
_FACTORIES = ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
              "logspace", "eye", "tensor", "as_tensor", "empty_strided", "zeros_like", "ones_like", "empty_like",
              "full_like", "rand_like", "randn_like", "randint_like")


def _cpu_device(device):
    """'cuda', 'cuda:1', torch.device('cuda', 0), 0 -> 'cpu'; anything else as it is."""
    if isinstance(device, torch.device) and device.type == "cuda":
        return "cpu"
    if isinstance(device, str) and device.split(":")[0] == "cuda":
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    return device


def _factories_mapped(mapping):
    """torch's factories and torch's default device (``torch.set_default_device``, ``with torch.device(...)``) with
    every device they are given passed through ``mapping`` (a function of the device). torch's default-device mode
    knows a factory by identity, from a table it builds once, on first use (``torch.utils._device.
    _device_constructors``): built after the factories are wrapped, it holds the wrappers, never sees the originals they
    call, and a factory then ignores the default device (Iris's flash-decode test made its tensors on the cpu where it
    had asked for the GPU). So the table is built from the originals first."""
    import torch.utils._device as default_device

    default_device._device_constructors()
    for name in _FACTORIES:
        setattr(torch, name, _device_mapped(getattr(torch, name), mapping))
    original_init = default_device.DeviceContext.__init__

    def init(self, device):   # (both ways of setting the default device make one of these)
        original_init(self, mapping(device))

    default_device.DeviceContext.__init__ = init


def cuda_ordinals_to(device):
    """Ranks sharing one GPU: every ``cuda:N`` a program names (Iris's tests build tensors on ``cuda:{rank}``) is
    this rank's GPU, in torch's factories, ``.to`` and ``.cuda``; said once by ``launch.set_device``'s rule."""
    if getattr(torch, "__gemmar_cuda_ordinals__", None) == device:
        return

    def mapped(where):
        if isinstance(where, torch.device) and where.type == "cuda" or \
                isinstance(where, str) and where.split(":")[0] == "cuda":
            return device
        if isinstance(where, int) and not isinstance(where, bool):
            return device
        return where

    if getattr(torch, "__gemmar_cuda_ordinals__", None) is None:
        _factories_mapped(lambda d: _ORDINALS["map"](d))
        original_to, original_cuda = torch.Tensor.to, torch.Tensor.cuda

        def to(self, *args, **kwargs):
            args = tuple(_ORDINALS["map"](a) if isinstance(a, (str, torch.device)) else a for a in args)
            if "device" in kwargs:
                kwargs["device"] = _ORDINALS["map"](kwargs["device"])
            return original_to(self, *args, **kwargs)

        def cuda(self, device=None, non_blocking=False, **kwargs):
            return original_cuda(self, _ORDINALS["map"](device if device is not None else "cuda"), non_blocking,
                                 **kwargs)

        torch.Tensor.to, torch.Tensor.cuda = to, cuda
    _ORDINALS["map"] = mapped
    torch.__gemmar_cuda_ordinals__ = device


_ORDINALS = {"map": lambda where: where}


def _device_mapped(fn, mapping):
    @functools.wraps(fn)
    def on_device(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = mapping(kwargs["device"])
        return fn(*args, **kwargs)

    return on_device


class CpuEvent:
    """torch.cuda.Event on the cpu backend: the host clock when recorded (kernels have run by then). For the
    sanitizer it orders as on a GPU: recorded on a stream, waited for by another stream or the host."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()
        sanitizer.host_event("record", event=id(self), stream=(stream or CpuStream.current).name)

    def synchronize(self):
        sanitizer.host_event("sync", event=id(self))

    def wait(self, stream=None):
        sanitizer.host_event("join", into=(stream or CpuStream.current).name, event=id(self))

    def query(self):
        return True

    def elapsed_time(self, end):
        if self.time is None or end.time is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end.time - self.time) * 1e3


class CpuGenerator(torch.Generator):
    """``torch.Generator(device="cuda")`` on the cpu backend: a CPU generator (still a ``torch.Generator``)."""

    def __new__(cls, device="cpu"):
        return super().__new__(cls, _cpu_device(device))

    def __init__(self, device="cpu"):
        pass


class CpuGraph:
    """``torch.cuda.CUDAGraph`` on the cpu backend. Inside ``with torch.cuda.graph(g)`` this rank's kernel launches
    and Iris device barriers are recorded, not run (as a capture runs nothing on a GPU); ``g.replay()`` runs them
    again in order, with the arguments they were captured with (a replay on a GPU reads the same addresses too).
    torch's own tensor operations inside a capture are not recorded: they run at once (a rank that needs them
    replayed must launch them as kernels)."""

    capturing = None   # the graph this rank is capturing now, or None

    def __init__(self, *args, **kwargs):
        self.calls = []

    def capture_begin(self, *args, **kwargs):
        if CpuGraph.capturing is not None:
            raise UsageError("torch.cuda.graph: a capture is already under way on this rank; end it first")
        self.calls = []
        CpuGraph.capturing = self

    def capture_end(self):
        CpuGraph.capturing = None

    def replay(self):
        for call in self.calls:
            call()

    def reset(self):
        self.calls = []

    def pool(self):
        return None

    def enable_debug_mode(self):
        pass

    @staticmethod
    def record(call):
        """Keep ``call`` for the replays when a capture is under way (True), else leave it to run now (False)."""
        if CpuGraph.capturing is None:
            return False
        CpuGraph.capturing.calls.append(call)
        return True


@contextlib.contextmanager
def cpu_graph_capture(graph, pool=None, stream=None, capture_error_mode=None, **unused):
    """``torch.cuda.graph(g)`` on the cpu backend (see :class:`CpuGraph`)."""
    graph.capture_begin()
    try:
        yield graph
    finally:
        graph.capture_end()


class CpuStream:
    """torch.cuda.Stream on the cpu backend: work runs in order as it is launched, so there is nothing to wait
    for. Each stream has a name the sanitizer knows its kernels by (``main`` the default one): kernels on two
    streams with no ``wait_stream``, event or synchronize between them are concurrent to it, as on a GPU."""

    made = 0
    current = None   # the stream ``torch.cuda.stream(s)`` made current (the default one outside)

    def __init__(self, device=None, priority=0, name=None, **unused):
        self.device = torch.device("cpu")
        if name is None:
            CpuStream.made += 1
            name = f"stream {CpuStream.made}"
        self.name = name

    def synchronize(self):
        sanitizer.host_event("sync", stream=self.name)

    def wait_stream(self, other):
        sanitizer.host_event("join", into=self.name, waits_for=other.name)

    def wait_event(self, event):
        event.wait(self)

    def record_event(self, event=None):
        event = event or CpuEvent()
        event.record(self)
        return event

    def query(self):
        return True

    def __enter__(self):   # (``with stream:`` as torch allows)
        self._context = cpu_stream(self)
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


CpuStream.current = DEFAULT_STREAM = CpuStream(name="main")


@contextlib.contextmanager
def cpu_stream(stream=None):
    """``torch.cuda.stream(s)`` on the cpu backend: ``s`` is the current stream inside, for the sanitizer too."""
    if stream is None:
        yield None
        return
    before, CpuStream.current = CpuStream.current, stream
    try:
        with sanitizer.on_stream(stream.name):
            yield stream
    finally:
        CpuStream.current = before


def cuda_on_cpu():
    if getattr(torch, "__gemmar_cuda_on_cpu__", False):
        return
    _factories_mapped(_cpu_device)
    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple(_cpu_device(a) if isinstance(a, (str, torch.device)) else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return original_to(self, *args, **kwargs)

    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **unused: self
    cuda = torch.cuda
    cuda.synchronize = lambda device=None: sanitizer.host_event("sync")
    cuda.Event, cuda.Stream = CpuEvent, CpuStream
    cuda.stream = cpu_stream
    cuda.current_stream = lambda device=None: CpuStream.current
    cuda.default_stream = lambda device=None: DEFAULT_STREAM
    torch.Generator = CpuGenerator
    cuda.CUDAGraph, cuda.graph = CpuGraph, cpu_graph_capture
    cuda.is_current_stream_capturing = lambda: CpuGraph.capturing is not None
    cuda.graph_pool_handle = lambda: None
    cuda.set_device = lambda device: None
    cuda.current_device = lambda: 0
    for name in ("range_push", "range_pop", "mark"):
        setattr(cuda.nvtx, name, lambda *args, **kwargs: None)
    cuda.nvtx.range = lambda *args, **kwargs: contextlib.nullcontext()
    cuda.get_device_properties = _cpu_properties
    cuda.get_device_name = lambda device=None: _cpu_properties().name
    cuda.manual_seed_all = lambda seed: None   # (torch.manual_seed already seeds the CPU)
    torch.__gemmar_cuda_on_cpu__ = True


def _cpu_properties(device=None):
    """torch.cuda.get_device_properties on the cpu backend: the machine, with its cores as multiprocessors
    (what Iris's examples size their grids by)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return types.SimpleNamespace(name="cpu (gemmar's cpu backend)", multi_processor_count=os.cpu_count() or 1,
                                 total_memory=memory, major=0, minor=0, warp_size=32, gcnArchName="cpu")


class InterpretedLaunch:
    """What a launch returns under the interpreter, where Triton returns nothing: reading a compiled
    kernel's metadata from it (Iris's wrappers read ``n_regs`` and ``n_spills``) is one clear line."""

    def __init__(self, kernel):
        self._kernel = kernel

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise UsageError(f"{self._kernel}(...).{name}: a kernel run by the Triton interpreter (the cpu backend) is not "
                         f"compiled, so it has no {name}; read it only on a GPU (Iris's examples check "
                         f"is_triton_interpret_set() first)")


def adapt_launches(backend):
    """Every kernel launch on this rank: AMD compiler options dropped where they do not apply (one line says
    so, once per option); under the interpreter an :class:`InterpretedLaunch` returned instead of None. The
    interpreter's launches are adapted through its owner (kernels/triton_support.py), inside its scope only."""
    import triton.runtime.jit as jit
    from triton.runtime.interpreter import InterpretedFunction

    if not getattr(jit.JITFunction.run, "__gemmar_adapted__", False):
        jit.JITFunction.run = _adapted_run(jit.JITFunction.run, backend)
    subscribe("interpreted launches return a handle",
              lambda replace: replace(InterpretedFunction, "run", _adapted_run(InterpretedFunction.run, backend)))


_TOLD = set()   # AMD options said to be dropped: once per process


def _adapted_run(original, backend, told=_TOLD):
    on_rocm = torch.version.hip is not None

    @functools.wraps(original)
    def run(self, *args, **kwargs):
        dropped = {} if on_rocm else {o: kwargs.pop(o) for o in AMD_ONLY_LAUNCH_OPTIONS if o in kwargs}
        if dropped and not told.issuperset(dropped) and rank_runtime.local_ranks()[0].rank == 0:
            told.update(dropped)
            settings = ", ".join(f"{k}={v!r}" for k, v in dropped.items())
            print(f"[gemmar] {settings}: AMD compiler option(s), dropped on the {backend} backend",
                  file=sys.stderr, flush=True)
        if type(self).__name__ == "InterpretedFunction" and CpuGraph.record(lambda: original(self, *args, **kwargs)):
            return InterpretedLaunch(getattr(self.fn, "__name__", "kernel"))
        launched = original(self, *args, **kwargs)
        if launched is None and type(self).__name__ == "InterpretedFunction":
            return InterpretedLaunch(getattr(self.fn, "__name__", "kernel"))
        return launched

    run.__gemmar_adapted__ = True
    return run


_WARNED_ASSUMES = set()   # kernel lines warned about, once per process as before the patches had a scope


def warn_false_assumes():
    """Under the interpreter a false ``tl.assume`` stops the program ("Assume failed"); on a GPU it is a hint
    the compiler may use, and the run goes on. Here: one warning per kernel line, and the run goes on (this
    layer's slot of the interpreter's patches, kernels/triton_support.py)."""
    subscribe("false tl.assume warns", _warning_assumes)


def _warning_assumes(replace):
    from triton.runtime import interpreter

    def create_assume(self, condition):
        if bool(getattr(condition, "data", condition).all()):
            return None
        frame = next((f for f in traceback.extract_stack()[::-1] if is_program_file(f.filename)), None)
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}" if frame else "a kernel"
        if where not in _WARNED_ASSUMES:
            _WARNED_ASSUMES.add(where)
            line = f" ({frame.line.strip()})" if frame and frame.line else ""
            print(f"[gemmar] warning: tl.assume is false at {where}{line}; on a GPU that is a wrong hint to the "
                  f"compiler, not a check: the run goes on", file=sys.stderr, flush=True)
        return None

    replace(interpreter.InterpreterBuilder, "create_assume", create_assume)


def is_program_file(filename):
    """Whether ``filename`` is the user's code, not Python's, torch's, Triton's or gemmar's."""
    return os.path.isfile(filename) and not os.path.realpath(filename).startswith(library_folders())
