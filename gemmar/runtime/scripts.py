"""What ``gemmar run`` does on each rank: gemmar's ``iris`` module in place of Iris, CUDA host calls made to
work on the cpu backend, and the program run as ``__main__``; the client (``gemmar/programs.py``) streams
its output and collects how each rank ended.

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

import torch

from ..errors import UsageError
from . import rank as rank_runtime

AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def installed_iris():
    """Where an Iris other than gemmar's module is installed or imported in this process, or None."""
    from .. import iris_compat

    if sys.modules.get("iris") is iris_compat:
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


def install_iris(replace_installed=False):
    """Make ``import iris`` give gemmar's module on this rank (one rank per engine). Refused, in one line,
    when a real Iris is installed here and ``replace_installed`` is not set."""
    from .. import iris_compat

    ranks = rank_runtime.local_ranks()
    if len(ranks) != 1:
        raise UsageError(f"Iris programs need one process per rank; this engine hosts ranks {[c.rank for c in ranks]} "
                         f"sharing one GPU: use as many GPUs as ranks, or the cpu backend")
    if not replace_installed:
        refuse_installed_iris()
    iris_compat._rank_heap = ranks[0].heap
    sys.modules["iris"] = iris_compat
    backend = ranks[0].backend
    if backend == "cpu":
        _cuda_on_cpu()
    _drop_amd_launch_options(backend)
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
    torch.__gemmar_cuda_on_cpu__ = True


def _drop_amd_launch_options(backend):
    """Launches with AMD compiler options run elsewhere without them; one line says so, once per option."""
    if torch.version.hip is not None:
        return
    import triton.runtime.jit as jit

    classes = [jit.JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    told = set()
    for cls in classes:
        if getattr(cls.run, "__gemmar_drops__", False):
            continue
        original = cls.run

        @functools.wraps(original)
        def run(self, *args, __original=original, **kwargs):
            dropped = {option: kwargs.pop(option) for option in AMD_ONLY_LAUNCH_OPTIONS if option in kwargs}
            if dropped and not told.issuperset(dropped) and rank_runtime.local_ranks()[0].rank == 0:
                told.update(dropped)
                settings = ", ".join(f"{k}={v!r}" for k, v in dropped.items())
                print(f"[gemmar] {settings}: AMD compiler option(s), dropped on the {backend} backend",
                      file=sys.stderr, flush=True)
            return __original(self, *args, **kwargs)

        run.__gemmar_drops__ = True
        cls.run = run


# -- running a program ------------------------------------------------------------------------------------
def failure_line(error):
    """One line for an exception a program raised: type, message's first line, and where in the user's code."""
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


def _innermost_program_frame(error):
    """The deepest frame of the error (or of what caused it) in the user's code, not in Python, torch,
    Triton or gemmar: for a kernel run by the interpreter, the kernel's line."""
    import sysconfig

    library = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"],
                    sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})
    frames, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frames += [f for f in traceback.extract_tb(error.__traceback__)
                   if os.path.isfile(f.filename) and not os.path.realpath(f.filename).startswith(library)]
        error = error.__cause__ or error.__context__
    return frames[-1] if frames else None


def run_program(path, args, cwd, replace_iris=False):
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` in ``cwd``, on this engine's rank.
    Returns {"rank", "exit_code", "error"}: 0 and None when it ended normally or by ``sys.exit(0)``."""
    rank = install_iris(replace_iris)
    saved = sys.argv, list(sys.path), os.getcwd()
    sys.argv = [path, *map(str, args)]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    os.chdir(cwd)
    code, error = 0, None
    try:
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
        rank_runtime.local_ranks()[0].heap.release_program_memory()
        sys.argv = saved[0]
        sys.path[:] = saved[1]
        os.chdir(saved[2])
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return {"rank": rank, "exit_code": code, "error": error}


# builtins.exit / quit (used by Iris's examples) raise SystemExit as sys.exit does, also under ipyparallel.
for _name in ("exit", "quit"):
    if not hasattr(builtins, _name):
        setattr(builtins, _name, sys.exit)
