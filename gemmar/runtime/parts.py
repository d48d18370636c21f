"""Kernel parts: one ``@triton.jit`` function of a package kernel, swapped for a participant's own.

The notebooks' puzzles ask for a piece of real kernel code (the tile order, one push of the atomics
kernel, the ring's reduction step, two_shot's sum; each algorithm's spec lists its parts) and run it inside
the package's kernel, on the cluster. The kernel takes the piece as a constexpr argument, and Triton compiles
(or interprets) it like any function it calls.

The participant's function is defined in the notebook's process, and the ranks are other processes. So
its *source* travels to them (:func:`part_sources`, on the client) and is defined again there
(:func:`load_parts`, on each rank), registered with ``linecache`` under a ``<gemmar part ...>`` name:
Triton reads a function's source through ``inspect``, and nothing is written to disk. The source sees
``triton``, ``tl`` (``triton.language``) and ``device`` (``gemmar.kernels.device``), and the participant's
own helper functions that the part calls, defined in the same notebook (or file): their source travels with
it.
"""

import hashlib
import inspect
import linecache
import textwrap
import traceback
import types

import triton
import triton.language as tl

from ..errors import UsageError
from ..kernels import device

SOURCE_PREFIX = "<gemmar part "


def part_sources(parts, spec):
    """Client side: check ``parts`` ({name: @triton.jit function}) against the algorithm's replaceable
    parts (``spec.parts``: the kernel's own functions, whose signatures they must match) and return
    {name: (function name, source)}, ready to ship to the ranks."""
    if not parts:
        return {}
    spec.check_parts(parts)
    return {name: (fn.fn.__name__, _with_helpers(fn.fn)) for name, fn in parts.items()}


def _with_helpers(python_fn):
    """``python_fn``'s source after the sources of the functions of the same module it calls (a helper
    ``@triton.jit`` function in the same cell), found through the names its code uses."""
    seen, sources = {python_fn.__name__}, []

    def walk(fn):
        for name in sorted(_names_used(fn.__code__)):
            inner = getattr(fn.__globals__.get(name), "fn", fn.__globals__.get(name))
            if name not in seen and inspect.isfunction(inner) and inner.__module__ == python_fn.__module__:
                seen.add(name)
                walk(inner)
                sources.append(function_source(inner))

    walk(python_fn)
    return "\n\n".join(sources + [function_source(python_fn)])


def _names_used(code):
    """Every global name a function's code (and the code nested in it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def function_source(obj, whose="", hint=""):
    """The source of a function (or class) defined in a notebook cell or a .py file, dedented; one line if it
    has none (``whose``: what the line starts with; ``hint``: what it ends with)."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError) as e:
        raise UsageError(f"{whose}the source of {obj.__name__} cannot be read ({e}): define it in a notebook "
                         f"cell or a .py file{hint}") from None


_loaded = {}   # (name, source) -> the function defined from it, so a repeated run compiles nothing again


def load_parts(sources):
    """Rank side: {name: @triton.jit function} defined from :func:`part_sources`' output."""
    parts = {}
    for name, (fn_name, source) in (sources or {}).items():
        key = (name, source)
        if key not in _loaded:
            digest = hashlib.sha1(source.encode()).hexdigest()[:10]
            filename = f"{SOURCE_PREFIX}{name} {digest}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            namespace = {"triton": triton, "tl": tl, "device": device, "__name__": f"gemmar_part_{name}"}
            try:
                exec(compile(source, filename, "exec"), namespace)
            except Exception as e:  # noqa: BLE001 - the participant's decorator line: say what broke
                raise UsageError(f"{name}: defining {fn_name} failed with {type(e).__name__}: {e} (the source "
                                 f"sees triton, tl, device and the helper functions it calls)") from None
            _loaded[key] = namespace[fn_name]
        parts[name] = _loaded[key]
    return parts


def failure_text(error, sources):
    """One line for an exception raised while a participant's parts (``sources``, as shipped) compiled or
    ran: the line of their code it came from, where one can tell, and the innermost error (the interpreter
    and the compiler wrap an error once per function it passes through)."""
    chain = [error]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    where = ""
    for link in chain:
        # Interpreted: a traceback frame in the part's <gemmar part ...> source.
        for frame in traceback.extract_tb(link.__traceback__):
            if frame.filename.startswith(SOURCE_PREFIX):
                part = frame.filename[len(SOURCE_PREFIX):].split()[0]
                where = f"your {part} failed at `{(frame.line or '').strip()}`"
        # Compiled: Triton's CompilationError carries the function's source and the failing node.
        src, line = getattr(link, "src", None), getattr(getattr(link, "node", None), "lineno", None)
        if isinstance(src, str) and line:
            for part, (fn_name, _) in sources.items():
                if f"def {fn_name}(" in src:
                    where = f"your {part} did not compile at `{src.splitlines()[line - 1].strip()}`"
    innermost = next((link for link in reversed(chain) if str(link).strip()), error)   # (not a bare StopIteration)
    lines = [line.strip() for line in str(innermost).strip().splitlines() if line.strip()]
    what = f"{type(innermost).__name__}: {lines[-1]}" if lines else type(innermost).__name__
    return f"{where or 'the kernel with your ' + ' and '.join(sources) + ' did not run'}: {what}"
