"""What ``gemmar run`` does on each rank: gemmar's ``iris`` package in place of Iris, CUDA host calls made to
work on the cpu backend, the program's own launch (``mp.spawn``, torchrun, ``torch.distributed``: ``launch.py``)
pointed at gemmar's ranks, and the program run as ``__main__``; the client (``runner.py``) streams its output
and collects how each rank ended.

``import iris`` gives ``host.py``, and the submodules of today's Iris package that programs import are
gemmar's: ``iris.device`` / ``iris.device.utils`` / ``iris.mem`` (``device.py``: ``DeviceContext``,
``read_realtime``), ``iris.hip``, ``iris.ccl``, ``iris.ops``, ``iris.host.tracing``. AMD-only pieces
(``iris.gluon``, ``iris.experimental``) are refused in one line when a program reaches into them.

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

import builtins
import contextlib
import functools
import importlib.util
import os
import runpy
import sys
import time
import traceback
import types

import torch

from .. import sanitizer
from ..errors import UsageError, gemmar_cause
from ..runtime import rank as rank_runtime
from . import launch

AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def installed_iris():
    """Where an Iris other than gemmar's module is installed or imported in this process, or None."""
    from . import host

    if sys.modules.get("iris") is host:
        return None
    try:
        spec = importlib.util.find_spec("iris")
    except ValueError:   # an `iris` already imported without a spec
        return getattr(sys.modules.get("iris"), "__file__", None) or "imported"
    return spec.origin if spec is not None else None


def refuse_installed_iris():
    where = installed_iris()
    if where is not None:
        raise UsageError(f"an installed Iris was found ({where}): gemmar will not put its own iris module in its "
                         f"place unless asked: add --replace_iris (replace_iris=True), or run the program with mpirun")


# Iris's package layout -> gemmar's modules (``gemmar.iris.<name>``); the AMD-only ones are refused on use.
PACKAGE_LAYOUT = {"iris": "host", "iris.device": "device", "iris.device.utils": "device",
                  "iris.device.triton": "device",
                  "iris.mem": "device", "iris.mem.utils": "device", "iris.mem.triton": "device", "iris.hip": "hip",
                  "iris.ccl": "ccl", "iris.ops": "ops", "iris.host": "host", "iris.host.tracing": "tracing",
                  "iris.host.tracing.events": "tracing"}
AMD_ONLY_MODULES = {"iris.gluon": "Gluon kernels (Triton's gluon dialect, as Iris uses it on ROCm)",
                    "iris.experimental": "Iris's experimental (Gluon) kernels",
                    "iris.device.gluon": "Gluon kernels (Triton's gluon dialect, as Iris uses it on ROCm)",
                    "iris.mem.gluon": "Gluon kernels (Triton's gluon dialect, as Iris uses it on ROCm)"}


def _amd_only_module(name, what):
    module = types.ModuleType(name)

    def refuse(attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise UsageError(f"{name}.{attribute}: {what} are AMD-only; gemmar's iris runs Triton kernels")

    module.__getattr__ = refuse
    return module


def _install_package():
    import importlib

    modules = {name: importlib.import_module(f"{__package__}.{target}") for name, target in PACKAGE_LAYOUT.items()}
    modules.update({name: _amd_only_module(name, what) for name, what in AMD_ONLY_MODULES.items()})
    for name in sorted(modules, key=lambda n: n.count(".")):   # parents first
        sys.modules[name] = modules[name]
        if "." in name:
            parent, _, child = name.rpartition(".")
            if modules[parent] is not modules[name]:
                setattr(modules[parent], child, modules[name])


def install_iris(replace_installed=False):
    """Make ``import iris`` give gemmar's package on this rank (one rank per engine). Refused, in one line,
    when a real Iris is installed here and ``replace_installed`` is not set."""
    from . import this_rank

    ranks = rank_runtime.local_ranks()
    if len(ranks) != 1:
        raise UsageError(f"Iris programs need one process per rank; this engine hosts ranks {[c.rank for c in ranks]} "
                         f"sharing one GPU: use as many GPUs as ranks, or the cpu backend")
    if not replace_installed:
        refuse_installed_iris()
    this_rank.heap = ranks[0].heap
    _install_package()
    backend = ranks[0].backend
    if backend == "cpu":
        _cuda_on_cpu()
        _warn_false_assumes()
    _adapt_launches(backend)
    return ranks[0].rank


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


def _device_to_cpu(fn):
    @functools.wraps(fn)
    def on_cpu(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    return on_cpu


class CpuEvent:
    """torch.cuda.Event on the cpu backend: the host clock when recorded (kernels have run by then)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        if self.time is None or end.time is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end.time - self.time) * 1e3


class CpuStream:
    """torch.cuda.Stream on the cpu backend: work runs in order as it is launched, so nothing to wait for."""

    def __init__(self, device=None, priority=0, **unused):
        self.device = torch.device("cpu")

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or CpuEvent()
        event.record()
        return event

    def query(self):
        return True


def _cuda_on_cpu():
    if getattr(torch, "__gemmar_cuda_on_cpu__", False):
        return
    for name in _FACTORIES:
        setattr(torch, name, _device_to_cpu(getattr(torch, name)))
    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple(_cpu_device(a) if isinstance(a, (str, torch.device)) else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return original_to(self, *args, **kwargs)

    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **unused: self
    cuda = torch.cuda
    cuda.synchronize = lambda device=None: None
    cuda.Event, cuda.Stream = CpuEvent, CpuStream
    cuda.stream = lambda stream=None: contextlib.nullcontext(stream)
    cuda.current_stream = cuda.default_stream = lambda device=None: CpuStream()
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


def _adapt_launches(backend):
    """Every kernel launch on this rank: AMD compiler options dropped where they do not apply (one line says
    so, once per option); under the interpreter an :class:`InterpretedLaunch` returned instead of None."""
    import triton.runtime.jit as jit

    classes = [jit.JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    told = set()
    on_rocm = torch.version.hip is not None
    for cls in classes:
        if getattr(cls.run, "__gemmar_adapted__", False):
            continue
        original = cls.run

        @functools.wraps(original)
        def run(self, *args, __original=original, **kwargs):
            dropped = {} if on_rocm else {o: kwargs.pop(o) for o in AMD_ONLY_LAUNCH_OPTIONS if o in kwargs}
            if dropped and not told.issuperset(dropped) and rank_runtime.local_ranks()[0].rank == 0:
                told.update(dropped)
                settings = ", ".join(f"{k}={v!r}" for k, v in dropped.items())
                print(f"[gemmar] {settings}: AMD compiler option(s), dropped on the {backend} backend",
                      file=sys.stderr, flush=True)
            launched = __original(self, *args, **kwargs)
            if launched is None and type(self).__name__ == "InterpretedFunction":
                return InterpretedLaunch(getattr(self.fn, "__name__", "kernel"))
            return launched

        run.__gemmar_adapted__ = True
        cls.run = run


def _warn_false_assumes():
    """Under the interpreter a false ``tl.assume`` stops the program ("Assume failed"); on a GPU it is a hint
    the compiler may use, and the run goes on. Here: one warning per kernel line, and the run goes on."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_assume, "__gemmar_warns__", False):
        return
    warned = set()

    def create_assume(self, condition):
        if bool(getattr(condition, "data", condition).all()):
            return None
        frame = next((f for f in traceback.extract_stack()[::-1] if _is_program_file(f.filename)), None)
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}" if frame else "a kernel"
        if where not in warned:
            warned.add(where)
            line = f" ({frame.line.strip()})" if frame and frame.line else ""
            print(f"[gemmar] warning: tl.assume is false at {where}{line}; on a GPU that is a wrong hint to the "
                  f"compiler, not a check: the run goes on", file=sys.stderr, flush=True)
        return None

    create_assume.__gemmar_warns__ = True
    builder.create_assume = create_assume


# -- running a program ------------------------------------------------------------------------------------
def failure_line(error):
    """One line for an exception a program raised: type, message's first line, and where in the user's code."""
    cause = gemmar_cause(error)
    if cause is not None and cause is not error:   # gemmar's own refusal from inside a kernel: already one line
        return f"{type(cause).__name__}: {cause}"
    message = str(error).strip()
    if type(error).__name__ in ("CompilationError", "InterpreterError") or "triton" in type(error).__module__:
        # Triton's messages carry the kernel's source; the cause is the last line (or the wrapped error).
        cause = error.__cause__ or error.__context__
        message = str(cause).strip() if cause is not None else message.splitlines()[-1] if message else ""
        if "inline_asm" in message:
            message = (f"{message}: inline assembly (e.g. AMD's s_memrealtime) cannot run under the Triton "
                       f"interpreter (the cpu backend)")
    first = message.splitlines()[0] if message else ""
    frame = _innermost_program_frame(error)
    where = f" ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
    return f"{type(error).__name__}: {first}{where}" if first else f"{type(error).__name__}{where}"


@functools.lru_cache(maxsize=None)
def _library_folders():
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(p) + os.sep for p in {paths["stdlib"], paths["purelib"], paths["platlib"],
                                                         os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})


def _is_program_file(filename):
    """Whether ``filename`` is the user's code, not Python's, torch's, Triton's or gemmar's."""
    return os.path.isfile(filename) and not os.path.realpath(filename).startswith(_library_folders())


def _innermost_program_frame(error):
    """The deepest frame of the error (or of what caused it) in the user's code: for a kernel run by the
    interpreter, the kernel's line."""
    frames, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frames += [f for f in traceback.extract_tb(error.__traceback__) if _is_program_file(f.filename)]
        error = error.__cause__ or error.__context__
    return frames[-1] if frames else None


def run_program(path, args, cwd, store_path, replace_iris=False, sanitize=False):
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` in ``cwd``, on this engine's rank;
    ``store_path``: a file in the cluster's private folder where this run's ranks meet for
    ``torch.distributed`` (``launch.py``). Returns {"rank", "exit_code", "error"}: 0 and None when it ended
    normally or by ``sys.exit(0)``; with ``sanitize``, also "sanitizer": this rank's record of heap accesses."""
    rank = install_iris(replace_iris)
    heap = rank_runtime.local_ranks()[0].heap
    saved = sys.argv, list(sys.path), os.getcwd(), set(sys.modules)
    sys.argv = [path, *map(str, args)]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    os.chdir(cwd)
    code, error, records = 0, None, []
    try:
        with launch.program_run(rank, heap.world_size, heap.backend, heap.device, heap.ranks_on_device == 1,
                                store_path, heap.timeout_s), sanitizer.recording(heap, sanitize) as records:
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:   # sys.exit("message"): Python prints it and exits 1
            print(e.code, file=sys.stderr)
            code, error = 1, f"SystemExit: {e.code}"
        if code and error is None:
            error = f"exit code {code}"
    except BaseException as e:  # noqa: BLE001 - whatever the program raised is its result
        code, error = 1, failure_line(e)
    finally:
        heap.release_program_memory()
        sys.argv = saved[0]
        sys.path[:] = saved[1]
        os.chdir(saved[2])
        # The program's own modules go with it: the next program may have a module of the same name
        # (Iris's examples each have a matmul_wrapper.py).
        for name in set(sys.modules) - saved[3]:
            if _is_program_file(getattr(sys.modules[name], "__file__", None) or ""):
                del sys.modules[name]
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return {"rank": rank, "exit_code": code, "error": error, "sanitizer": records[0] if records else None}


# builtins.exit / quit (used by Iris's examples) raise SystemExit as sys.exit does, also under ipyparallel.
for _name in ("exit", "quit"):
    if not hasattr(builtins, _name):
        setattr(builtins, _name, sys.exit)
