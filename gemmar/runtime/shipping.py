"""A user's algorithm travels to the ranks as source, the way puzzle parts do (``runtime/parts.py``).

A spec written in a notebook cell or a .py file refers to functions and kernels that exist only in the
client's process. :func:`ship` (client) turns it into plain data: the spec's fields, and the source of
every function, kernel and class of the user's that its functions reach through their globals, found by
walking the names their code uses. Names from gemmar, Triton, torch or any other installed module travel
as imports, and other values (constants, ``tl.constexpr``, phases) by value. :func:`unship` (rank) defines
the sources again in one namespace, registered with ``linecache`` so that Triton can read them, and
rebuilds and registers the spec. Nothing is written to disk.
"""

import ast
import dataclasses
import hashlib
import importlib
import inspect
import linecache
import pickle
import sys
import types

from ..errors import UsageError
from ..kernels.spec import AlgorithmSpec, Part
from .parts import _names_used, function_source

FUNCTION_FIELDS = ("buffers", "launches", "output", "c_dtype", "events_per_program", "events_per_launch")
SOURCE_PREFIX = "<gemmar algorithm "


def _python_function(value):
    """The Python function of a @triton.jit function, the function itself, or None."""
    fn = getattr(value, "fn", value)
    return fn if inspect.isfunction(fn) else None


class _Collector:
    def __init__(self, spec):
        self.spec, self.user_modules = spec, set()
        self.sources, self.imports, self.values, self.seen = {}, {}, {}, set()

    def user_function(self, what, value):
        fn = _python_function(value)
        if fn is None:
            raise UsageError(f"algorithm {self.spec.name}: {what} must be a function, got {type(value).__name__}")
        if fn.__name__ == "<lambda>":
            raise UsageError(f"algorithm {self.spec.name}: {what} is a lambda; define it with def so that its source "
                             f"can travel to the ranks")
        self.user_modules.add(fn.__module__)
        return fn

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
        """``obj``'s source, and the names its decorators use (``@triton.jit``, ``@dataclass``), which its
        code does not mention."""
        source = self.sources[name] = function_source(obj, f"algorithm {self.spec.name}: ", " (a class in a notebook "
                                                      "cell: use a dict or types.SimpleNamespace instead)")
        for node in ast.parse(source).body[:1]:
            for decorator in getattr(node, "decorator_list", ()):
                for used in (n.id for n in ast.walk(decorator) if isinstance(n, ast.Name)):
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
                raise UsageError(f"algorithm {self.spec.name}: the global {name!r} its code uses cannot travel to the "
                                 f"ranks ({type(e).__name__}): make it a function, a constant or an import") from None


def _importable(module, qualname, value):
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        return found is value
    except (ImportError, AttributeError):
        return False


def ship(spec):
    """Client side: a built-in spec travels as its name (None here); a user's as data and source."""
    if spec.builtin:
        return None
    collect = _Collector(spec)
    functions = {}
    for what in FUNCTION_FIELDS:
        value = getattr(spec, what)
        if value is not None:
            functions[what] = collect.user_function(what, value).__name__
    parts = {name: (collect.user_function(f"part {name}", part.reference).__name__, part.returns)
             for name, part in spec.parts.items()}
    mistake_parts = {mistake: {name: collect.user_function(f"mistake {mistake}'s {name}", fn).__name__
                               for name, fn in swaps.items()} for mistake, swaps in spec.mistake_parts.items()}
    roots = [getattr(spec, what) for what in functions] + [part.reference for part in spec.parts.values()] + \
        [fn for swaps in spec.mistake_parts.values() for fn in swaps.values()] + list(spec.helpers)
    for root in roots:
        collect.add_function(collect.user_function("a helper", root))
    data = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
            if f.name not in FUNCTION_FIELDS + ("parts", "mistake_parts", "helpers")}
    shipped = dict(data=data, functions=functions, parts=parts, mistake_parts=mistake_parts,
                   sources=collect.sources, imports=collect.imports, values=collect.values)
    shipped["digest"] = hashlib.sha1(pickle.dumps((data, functions, parts, mistake_parts, collect.sources,
                                                   collect.imports))).hexdigest()[:12]
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
    namespace = {"__name__": f"gemmar_algorithm_{name}"}
    for alias, (module, qualname) in shipped["imports"].items():
        value = importlib.import_module(module)
        for part in (qualname.split(".") if qualname else ()):
            value = getattr(value, part)
        namespace[alias] = value
    namespace.update({alias: pickle.loads(blob) for alias, blob in shipped["values"].items()})
    text = "\n\n".join(shipped["sources"].values()) + "\n"
    filename = f"{SOURCE_PREFIX}{name} {shipped['digest']}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    try:
        exec(compile(text, filename, "exec"), namespace)
    except Exception as e:  # noqa: BLE001 - the user's code: one line that says what broke
        raise UsageError(f"algorithm {name}: defining its code on the rank failed with {type(e).__name__}: {e}") \
            from None
    fields = dict(shipped["data"])
    fields.update({what: namespace[fn] for what, fn in shipped["functions"].items()})
    fields["parts"] = {part: Part(namespace[fn], returns) for part, (fn, returns) in shipped["parts"].items()}
    fields["mistake_parts"] = {m: {part: namespace[fn] for part, fn in swaps.items()}
                               for m, swaps in shipped["mistake_parts"].items()}
    spec = AlgorithmSpec(**fields)
    register_algorithm(spec)
    _unshipped[shipped["digest"]] = spec
    return spec
