"""What a participant can reach from a puzzle notebook before its check says right, as a notebook's own
process sees it (tests/test_exercises.py runs this in a process of its own, without TRITON_INTERPRET, as a
Jupyter kernel is). ``python answer_routes.py NOTEBOOK...`` prints JSON: {notebook: [[route, text], ...]}.

The routes: the notebook's own cells before the check; every name its code imports, and every ``gemmar.x.y``
name or ``gemmar/x/y.py`` file its cells mention: ``??`` on it (IPython's inspector: source and docstring),
``inspect.getsource`` of it and of a @triton.jit function's ``.fn``; for a module, its whole source (what
``module??`` prints) and ``??`` on each of its attributes; and what each ``show_source(...)`` cell shows.
"""

import ast
import importlib
import inspect
import json
import re
import sys
import types

import nbformat
from IPython.core.interactiveshell import InteractiveShell

CHECKS = re.compile(r"check_(tile_coords|push_partial|reduce_step|sum_partials)\(")


def cells_before_check(path):
    """The cells up to the puzzle's check cell, which is included (it imports the check before it calls it)."""
    cells = []
    for cell in nbformat.read(path, as_version=4).cells:
        cells.append(cell)
        if CHECKS.search(cell.source):
            return cells
    raise AssertionError(f"{path}: no puzzle check")


def _code(cell):
    # (IPython's %magics and !shell lines are not Python)
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


def _resolve(dotted):
    """The object a dotted name reaches (the longest importable module, then attributes), or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                found = getattr(found, name)
        except AttributeError:
            return None
        return found
    return None


def reached(cells):
    """{route: object} for every name the cells import or mention."""
    names = set()
    for cell in cells:
        text = cell.source
        names |= {m.rstrip(".") for m in re.findall(r"\bgemmar(?:\.[A-Za-z_]\w*)+", text)}
        names |= {m[:-3].replace("/", ".") for m in re.findall(r"\bgemmar/[\w/]+\.py", text)}
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(_code(cell))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names.add(node.module)
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
    objects = {}
    for name in sorted(names):
        if name.split(".")[0] != "gemmar":
            continue   # (torch, matplotlib, triton: not the package's)
        found = _resolve(name)
        if found is not None:
            objects[name] = found
    return objects


def texts_of(route, obj, inspector):
    """[(route, text)] that ``??``, ``?`` and inspect show of ``obj``."""
    out = []
    info = inspector.info(obj, detail_level=1)
    for key in ("source", "docstring"):
        if info.get(key):
            out.append((f"{route}?? ({key})", info[key]))
    for target, how in ((obj, "inspect.getsource"), (getattr(obj, "fn", None), "inspect.getsource(.fn)")):
        if target is None:
            continue
        try:
            out.append((f"{how}({route})", inspect.getsource(target)))
        except (OSError, TypeError):
            pass
    doc = getattr(getattr(obj, "fn", obj), "__doc__", None)
    if isinstance(doc, str):
        out.append((f"{route}.__doc__", doc))
    return out


def walk(path):
    inspector = InteractiveShell.instance().inspector
    cells = cells_before_check(path)
    found = [(f"cell {i}", cell.source) for i, cell in enumerate(cells)]
    objects = reached(cells)
    for route, obj in objects.items():
        found += texts_of(route, obj, inspector)
        if isinstance(obj, types.ModuleType):
            for name, value in sorted(vars(obj).items()):
                own = getattr(getattr(value, "fn", value), "__module__", None) or type(value).__module__
                if not name.startswith("__") and (callable(value) or hasattr(value, "reference")) and \
                        str(own).startswith("gemmar"):
                    found += texts_of(f"{route}.{name}", value, inspector)
                    if hasattr(value, "reference"):   # (a spec's Part: the function a puzzle replaces)
                        found += texts_of(f"{route}.{name}.reference", value.reference, inspector)
    from gemmar.analysis.source import show_source

    namespace = {"show_source": show_source}
    for cell in cells:
        for call in re.findall(r"^show_source\((\w+)\)", _code(cell), re.MULTILINE):
            target = next((obj for route, obj in objects.items() if route.endswith("." + call)), None)
            assert target is not None, (path, call)
            found.append((f"show_source({call})", namespace["show_source"](target).data))
    return found


if __name__ == "__main__":
    print(json.dumps({path: walk(path) for path in sys.argv[1:]}))
