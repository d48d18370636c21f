"""What ``gemmar run`` does on each rank: the rank made ready for a program written for GPUs (CUDA host calls
made to work on the cpu backend, AMD-only launch options dropped: ``host_calls.py``), every layer's hook
(``hooks.py``: gemmar's Iris layer makes ``import iris`` give an Iris), the program's own launch (``mp.spawn``,
torchrun, ``torch.distributed``: ``launch.py``) pointed at gemmar's ranks, and the program run as ``__main__``;
the client (``runner.py``) streams its output and collects how each rank ended.
"""

import builtins
import contextlib
import os
import runpy
import signal
import sys
import time
import traceback


from .. import sanitizer
from ..errors import UsageError, gemmar_cause
from ..kernels.triton_support import gemmar_interpreter
from ..runtime.processes import descendants, end_descendants_since
from ..runtime import rank as rank_runtime
from . import guard, hooks, launch, whereabouts
from .host_calls import adapt_launches, cuda_on_cpu, cuda_ordinals_to, is_program_file, warn_false_assumes


def prepare_rank(plans):
    """Make this engine's rank (one per engine) ready for a program, then run every layer's hook with its plan
    (``hooks.plans``). Returns the rank."""
    ranks = rank_runtime.local_ranks()
    if len(ranks) != 1:
        raise UsageError(f"programs need one process per rank; this engine hosts ranks {[c.rank for c in ranks]} "
                         f"sharing one GPU: use as many GPUs as ranks, or the cpu backend")
    heap = ranks[0].heap
    if heap.backend == "cpu":
        cuda_on_cpu()
        warn_false_assumes()
    elif heap.ranks_on_device > 1:
        cuda_ordinals_to(heap.device)
    adapt_launches(heap.backend)
    hooks.prepare_rank(plans)
    return ranks[0].rank


_CELLS_SCOPE = []   # gemmar's interpreter scope that %%px cells run in: entered once, held while the engine lives


def prepare_cells(plans):
    """``Cluster.activate``: this rank made ready as for a program, and gemmar's interpreter scope
    (kernels/triton_support.py) entered for good, so that the ``%%px`` cells that follow run as a program's code
    does (the engine is gemmar's process, not the participant's notebook). Returns the rank."""
    if not _CELLS_SCOPE:
        scope = gemmar_interpreter()
        scope.__enter__()
        _CELLS_SCOPE.append(scope)
    return prepare_rank(plans)


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
    if "illegal memory access" in first or "illegal address" in first:
        first += (f" (this rank's kernel touched memory outside every heap: most often a rank outside 0 to "
                  f"{_world_size() - 1} in to_rank/from_rank, or an offset past its buffer; run it on cpu ranks, "
                  f"--backend cpu, to have the access named)")
    frame = _innermost_program_frame(error)
    where = f" ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
    return f"{type(error).__name__}: {first}{where}" if first else f"{type(error).__name__}{where}"


def _world_size():
    ranks = rank_runtime.local_ranks() if rank_runtime._ranks else []
    return ranks[0].heap.world_size if ranks else 0


def _innermost_program_frame(error):
    """The deepest frame of the error (or of what caused it) in the user's code: for a kernel run by the
    interpreter, the kernel's line."""
    # (Walked frame by frame rather than by traceback.extract_tb, which reads every frame's line: a RecursionError
    # under a recursion limit of 10**6 has a million frames, and took 71 s.)
    found, seen, mine = None, set(), {}
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename not in mine:
                mine[code.co_filename] = is_program_file(code.co_filename)
            if mine[code.co_filename]:
                found = code.co_filename, tb.tb_lineno, code.co_name
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return traceback.FrameSummary(*found, lookup_line=False) if found else None


class _ProcessState:
    """What a program may change in its rank's process that the engine's next call would inherit: the standard
    streams (``sys.stdout = None`` lost every result), the environment (``os.environ.clear()`` left Triton with
    "0 active drivers"), the umask, the recursion limit, and the handlers of the signals that end or interrupt
    a process. Taken when made; ``restore()`` puts back what changed."""

    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGALRM", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGPIPE")

    def __init__(self):
        self.streams = sys.stdin, sys.stdout, sys.stderr
        self.environ = dict(os.environ)
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.recursion_limit = sys.getrecursionlimit()
        self.handlers = {}
        for name in self.SIGNALS:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                number = getattr(signal, name)
                self.handlers[number] = signal.getsignal(number)

    def restore(self):
        sys.stdin, sys.stdout, sys.stderr = self.streams
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        os.umask(self.umask)
        sys.setrecursionlimit(self.recursion_limit)
        with contextlib.suppress(AttributeError, ValueError, OSError):
            signal.alarm(0)   # (an alarm the program set would interrupt the engine later)
        for number, handler in self.handlers.items():
            if handler is not None and signal.getsignal(number) is not handler:
                with contextlib.suppress(ValueError, OSError, TypeError):   # (not the main thread: left)
                    signal.signal(number, handler)


def run_program(path, args, cwd, store_path, plans, sanitize=False):
    """:func:`_run_program` inside gemmar's interpreter scope (kernels/triton_support.py): the whole program, and
    its layers' set-up too (a real Iris makes its aggregates when the hook imports it)."""
    with gemmar_interpreter():
        return _run_program(path, args, cwd, store_path, plans, sanitize)


def _run_program(path, args, cwd, store_path, plans, sanitize=False):
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` in ``cwd``, on this engine's rank;
    ``store_path``: a file in the cluster's private folder where this run's ranks meet for
    ``torch.distributed`` (``launch.py``). Returns {"rank", "exit_code", "error"}: 0 and None when it ended
    normally or by ``sys.exit(0)``; with ``sanitize``, also "sanitizer": this rank's record of heap accesses.
    ``plans``: each program hook's plan (``hooks.plans``)."""
    rank = prepare_rank(plans)
    heap = rank_runtime.local_ranks()[0].heap
    started_before = descendants()   # what the program starts ends with it (end_descendants_since below)
    saved = sys.argv, list(sys.path), os.getcwd(), set(sys.modules)
    process_state = _ProcessState()   # (restored after the program: the next call on this rank starts as this one)
    sys.argv = [path, *map(str, args)]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    os.chdir(cwd)
    code, error, records = 0, None, []
    try:
        with launch.program_run(rank, heap.world_size, heap.backend, heap.device, heap.ranks_on_device == 1,
                                store_path, heap.timeout_s), sanitizer.recording(heap, sanitize) as records, \
                whereabouts.answering(whereabouts.stack_file(store_path, rank)), guard.ancestors_guarded(rank):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            # (int(): pytest.main's ExitCode is an IntEnum, which goes back to the client by reference to a class
            # the client may not hold as the same object: PicklingError instead of the exit code, on the GPU box)
            code = int(e.code or 0)
        else:   # sys.exit("message"): Python prints it and exits 1
            print(e.code, file=sys.stderr)
            code, error = 1, f"SystemExit: {e.code}"
        if code and error is None:
            error = f"exit code {code}"
    except BaseException as e:  # noqa: BLE001 - whatever the program raised is its result
        code, error = 1, failure_line(e)
    finally:
        ended_at = time.time()   # before the cleanup: which rank failed first (ProgramResult.exit_code)
        end_descendants_since(started_before)
        process_state.restore()
        heap.release_program_memory()
        sys.argv = saved[0]
        sys.path[:] = saved[1]
        with contextlib.suppress(OSError):   # (a folder the program removed: the root then)
            os.chdir(saved[2] if os.path.isdir(saved[2]) else "/")
        # The program's own modules go with it: the next program may have a module of the same name
        # (Iris's examples each have a matmul_wrapper.py).
        for name in set(sys.modules) - saved[3]:
            if is_program_file(getattr(sys.modules[name], "__file__", None) or ""):
                del sys.modules[name]
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return {"rank": rank, "exit_code": code, "error": error, "sanitizer": records[0] if records else None,
            "ended_at": ended_at}


# builtins.exit / quit (used by Iris's examples) raise SystemExit as sys.exit does, also under ipyparallel.
for _name in ("exit", "quit"):
    if not hasattr(builtins, _name):
        setattr(builtins, _name, sys.exit)
