"""User code travels to the ranks as source: a participant's kernel parts and a user's whole algorithm.

A part (the notebooks' puzzles: one ``@triton.jit`` function of a package kernel, swapped for the
participant's own; each algorithm's spec lists its parts) or a spec written in a notebook cell or a .py file
exists only in the client's process, and the ranks are other processes. So it travels as plain data
(:func:`ship_parts`, :func:`ship`, on the client): the source of every function, kernel and class of the
user's that it reaches through its globals, found by walking the names its code uses; names from gemmar,
Triton, torch or any other installed module travel as imports, and other values (constants,
``tl.constexpr``, phases) by value. gemmar's own functions (a built-in part, ``kernels/mistakes.py``) travel
as imports. On each rank (:func:`load_parts`, :func:`unship`) the sources are defined again in one namespace,
registered with ``linecache`` under a ``<gemmar ...>`` name: Triton reads a function's source through
``inspect``, and nothing is written to disk. A kernel takes a part as a constexpr argument, and Triton
compiles (or interprets) it like any function it calls.
"""

import ast
import dataclasses
import hashlib
import importlib
import inspect
import linecache
import pickle
import sys
import textwrap
import traceback
import types

from ..errors import UsageError
from ..kernels.spec import AlgorithmSpec, Part

FUNCTION_FIELDS = ("buffers", "launches", "output", "c_dtype", "events_per_program", "events_per_launch")
PART_PREFIX, ALGORITHM_PREFIX = "<gemmar part ", "<gemmar algorithm "


def _python_function(value):
    """The Python function of a @triton.jit function, the function itself, or None."""
    fn = getattr(value, "fn", value)
    return fn if inspect.isfunction(fn) else None


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


def _gemmars_own(value):
    """(module, qualname) of one of gemmar's own functions (it travels as an import), else None."""
    fn = _python_function(value)
    if fn is not None and fn.__module__.split(".")[0] == "gemmar" and _importable(fn.__module__, fn.__qualname__,
                                                                                  value):
        return (fn.__module__, fn.__qualname__)
    return None


def _importable(module, qualname, value):
    try:
        return _imported(module, qualname) is value
    except (ImportError, AttributeError):
        return False


def _imported(module, qualname):
    found = importlib.import_module(module)
    for name in (qualname.split(".") if qualname else ()):
        found = getattr(found, name)
    return found


class _Collector:
    """The sources, imports and values that some user functions need, found by walking their globals."""

    def __init__(self, whose):
        self.whose, self.user_modules = whose, set()   # whose: what its errors start with ("algorithm x: ")
        self.sources, self.imports, self.values, self.seen = {}, {}, {}, set()

    def user_function(self, what, value):
        fn = _python_function(value)
        if fn is None:
            raise UsageError(f"{self.whose}{what} must be a function, got {type(value).__name__}")
        if fn.__name__ == "<lambda>":
            raise UsageError(f"{self.whose}{what} is a lambda; define it with def so that its source can travel to "
                             f"the ranks")
        self.user_modules.add(fn.__module__)
        return fn

    def reference(self, what, value):
        """How a function travels: gemmar's own as (module, qualname), a user's as its name (with its source)."""
        return _gemmars_own(value) or self.user_function(what, value).__name__

    def add_function(self, value):
        fn = _python_function(value)
        if fn.__name__ in self.seen:
            return
        self.seen.add(fn.__name__)
        self.add_source(fn.__name__, fn, fn.__globals__)
        for used in sorted(_names_used(fn.__code__)):
            if used in fn.__globals__ and used not in self.seen:
                self.add_global(used, fn.__globals__[used])

    def add_source(self, name, obj, module_globals):
        """``obj``'s source, and the names its decorators and annotations use (``@triton.jit``,
        ``BLOCK: tl.constexpr``), which its code does not mention."""
        source = self.sources[name] = function_source(obj, self.whose, " (a class in a notebook cell: use a dict "
                                                      "or types.SimpleNamespace instead)")
        for node in ast.parse(source).body[:1]:
            outside_code = list(getattr(node, "decorator_list", ()))
            if isinstance(node, ast.FunctionDef):
                outside_code += [arg.annotation for arg in node.args.args + node.args.kwonlyargs if arg.annotation]
            for part in outside_code:
                for used in (n.id for n in ast.walk(part) if isinstance(n, ast.Name)):
                    if used in module_globals and used not in self.seen:
                        self.add_global(used, module_globals[used])

    def add_global(self, name, value):
        module = getattr(value, "__module__", None)
        if isinstance(value, types.ModuleType):
            self.imports[name] = (value.__name__, None)
        elif module in self.user_modules and (_python_function(value) is not None or inspect.isclass(value)):
            if inspect.isclass(value):
                self.seen.add(name)
                self.add_source(name, value, vars(sys.modules[value.__module__]))
            else:
                self.add_function(value)
        elif module and module not in self.user_modules and hasattr(value, "__qualname__") and \
                _importable(module, value.__qualname__, value):
            self.imports[name] = (module, value.__qualname__)
        else:
            try:
                self.values[name] = pickle.dumps(value)
            except Exception as e:  # noqa: BLE001 - say which name cannot travel
                raise UsageError(f"{self.whose}the global {name!r} its code uses cannot travel to the ranks "
                                 f"({type(e).__name__}): make it a function, a constant or an import") from None

    def shipped(self, **fields):
        shipped = dict(fields, sources=self.sources, imports=self.imports, values=self.values)
        shipped["digest"] = hashlib.sha1(pickle.dumps(tuple(shipped[k] for k in sorted(shipped)))).hexdigest()[:12]
        return shipped


def _register(shipped, filename):
    """The shipped sources as one text under ``filename`` in ``linecache`` (where Triton and a report's
    line read them: on the ranks, and on the client too, where the sanitizer's race report is written)."""
    text = "\n\n".join(shipped["sources"].values()) + "\n"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    return text


def _define(shipped, filename, whose):
    """Rank side: a namespace with the shipped imports and values, and the sources defined in it."""
    namespace = {"__name__": f"gemmar_user_code_{shipped['digest']}"}
    namespace.update({alias: _imported(module, qualname) for alias, (module, qualname) in shipped["imports"].items()})
    namespace.update({alias: pickle.loads(blob) for alias, blob in shipped["values"].items()})
    text = _register(shipped, filename)
    try:
        exec(compile(text, filename, "exec"), namespace)
    except Exception as e:  # noqa: BLE001 - the user's code: one line that says what broke
        raise UsageError(f"{whose} failed with {type(e).__name__}: {e}") from None
    return namespace


def _resolve(reference, namespace):
    return _imported(*reference) if isinstance(reference, tuple) else namespace[reference]


# -- a participant's kernel parts ------------------------------------------------------------------------
def ship_parts(parts, spec):
    """Client side: check ``parts`` ({name: @triton.jit function}) against the algorithm's replaceable
    parts (``spec.parts``: the kernel's own functions, whose signatures they must match) and return
    {name: shipped part}, ready for :func:`load_parts` on the ranks."""
    if not parts:
        return {}
    spec.check_parts(parts)
    shipped = {}
    for name, fn in parts.items():
        collect = _Collector(f"{name}: ")
        function = collect.reference(name, fn)
        if not isinstance(function, tuple):
            collect.add_function(fn)
        shipped[name] = collect.shipped(function=function)
        _register(shipped[name], f"{PART_PREFIX}{name} {shipped[name]['digest']}>")
    return shipped


_loaded = {}   # digest -> the function defined from it, so a repeated run compiles nothing again


def gemmars_own(shipped_part):
    """Whether a shipped part is one of gemmar's own functions (a teaching mistake's): not a participant's code."""
    return isinstance(shipped_part["function"], tuple)


def load_parts(shipped_parts):
    """Rank side: {name: @triton.jit function} defined from :func:`ship_parts`' output."""
    parts = {}
    for name, shipped in (shipped_parts or {}).items():
        if shipped["digest"] not in _loaded:
            filename = f"{PART_PREFIX}{name} {shipped['digest']}>"
            whose = f"{name}: defining {shipped['function']}"
            _loaded[shipped["digest"]] = _resolve(shipped["function"], _define(shipped, filename, whose))
        parts[name] = _loaded[shipped["digest"]]
    return parts


def failure_text(error, shipped_parts):
    """One line for an exception raised while a participant's parts (as shipped) compiled or ran: the line
    of their code it came from, where one can tell, and the innermost error (the interpreter and the
    compiler wrap an error once per function it passes through)."""
    chain = [error]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    where = ""
    for link in chain:
        # Interpreted: a traceback frame in the part's <gemmar part ...> source.
        for frame in traceback.extract_tb(link.__traceback__):
            if frame.filename.startswith(PART_PREFIX):
                part = frame.filename[len(PART_PREFIX):].split()[0]
                where = f"your {part} failed at `{(frame.line or '').strip()}`"
        # Compiled: Triton's CompilationError carries the function's source and the failing node.
        src, line = getattr(link, "src", None), getattr(getattr(link, "node", None), "lineno", None)
        if isinstance(src, str) and line:
            for part, shipped in shipped_parts.items():
                if f"def {shipped['function']}(" in src:
                    where = f"your {part} did not compile at `{src.splitlines()[line - 1].strip()}`"
    innermost = next((link for link in reversed(chain) if str(link).strip()), error)   # (not a bare StopIteration)
    lines = [line.strip() for line in str(innermost).strip().splitlines() if line.strip()]
    what = f"{type(innermost).__name__}: {lines[-1]}" if lines else type(innermost).__name__
    if where and where[where.index("`"):] in what:   # (a sanitizer's report names the line itself)
        where = where[:where.index(" at `")]
    return f"{where or 'the kernel with your ' + ' and '.join(shipped_parts) + ' did not run'}: {what}"


# -- a user's algorithm ----------------------------------------------------------------------------------
def ship(spec):
    """Client side: a built-in spec travels as its name (None here); a user's as data and source."""
    if spec.builtin:
        return None
    collect = _Collector(f"algorithm {spec.name}: ")
    functions = {what: collect.user_function(what, getattr(spec, what)).__name__
                 for what in FUNCTION_FIELDS if getattr(spec, what) is not None}
    parts = {name: (collect.reference(f"part {name}", part.reference), part.returns)
             for name, part in spec.parts.items()}
    mistake_parts = {mistake: {name: collect.reference(f"mistake {mistake}'s {name}", fn) for name, fn in swaps.items()}
                     for mistake, swaps in spec.mistake_parts.items()}
    roots = [getattr(spec, what) for what in functions] + [part.reference for part in spec.parts.values()] + \
        [fn for swaps in spec.mistake_parts.values() for fn in swaps.values()] + list(spec.helpers)
    for root in roots:
        if _gemmars_own(root) is None:
            collect.add_function(collect.user_function("a helper", root))
    data = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
            if f.name not in FUNCTION_FIELDS + ("parts", "mistake_parts", "helpers")}
    shipped = collect.shipped(data=data, functions=functions, parts=parts, mistake_parts=mistake_parts)
    _register(shipped, f"{ALGORITHM_PREFIX}{spec.name} {shipped['digest']}>")
    return shipped


_unshipped = {}   # digest -> spec, so a repeated run defines (and compiles) nothing again


def unship(shipped):
    """Rank side: define a shipped spec's sources again and register the spec; returns it."""
    from ..algorithms import register_algorithm

    if shipped is None:
        return None
    if shipped["digest"] in _unshipped:
        return _unshipped[shipped["digest"]]
    name = shipped["data"]["name"]
    namespace = _define(shipped, f"{ALGORITHM_PREFIX}{name} {shipped['digest']}>",
                        f"algorithm {name}: defining its code on the rank")
    fields = dict(shipped["data"])
    fields.update({what: namespace[fn] for what, fn in shipped["functions"].items()})
    fields["parts"] = {part: Part(_resolve(fn, namespace), returns) for part, (fn, returns) in shipped["parts"].items()}
    fields["mistake_parts"] = {m: {part: _resolve(fn, namespace) for part, fn in swaps.items()}
                               for m, swaps in shipped["mistake_parts"].items()}
    spec = AlgorithmSpec(**fields)
    register_algorithm(spec)
    _unshipped[shipped["digest"]] = spec
    return spec
