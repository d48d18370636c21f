"""The package's layers, from its own imports: no module imports from a layer above it, and no cycle; the kit
never imports the Iris layer (gemmar/iris/, which plugs in through gemmar/programs/hooks.py).

the Iris layer (iris) -> client (cluster, cli, commands, programs, outputs, console, exercises, explorer, report,
progress, __init__) -> runtime, analysis -> config, algorithms (the registry of specs), sanitizer -> kernels (with
each algorithm's spec) -> errors
"""

import ast
import collections
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gemmar")
LAYER = {"__init__": 5, "__main__": 5, "cluster": 4, "cli": 4, "commands": 4, "outputs": 4, "console": 4, "exercises": 4, "partial_counts": 4, "progress": 4,
         "explorer": 4, "report": 4, "programs": 4, "iris": 6, "runtime": 3, "analysis": 3, "sanitizer": 2, "algorithms": 2, "config": 2,
         "tuning": 2, "kernels": 1, "errors": 0, "interrupts": 0,
         "tune_command": 4, "tuner": 4, "tuning_cache": 2}


def module_imports():
    """(importing module, imported module) for every import of a gemmar module inside gemmar."""
    edges = set()
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            parts = ["gemmar"] + os.path.relpath(path, PACKAGE)[:-3].split(os.sep)
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            package = module.split(".") if name == "__init__.py" else module.split(".")[:-1]
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = package[:len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                    edges.update((module, target if node.module else f"{target}.{a.name}") for a in node.names)
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gemmar"):
                    edges.add((module, node.module))
    return edges


def layer(module):
    parts = module.split(".")
    return LAYER[parts[1] if len(parts) > 1 else "__init__"]


def test_no_module_imports_from_a_layer_above_it():
    edges = module_imports()
    assert len(edges) > 40   # the walk found the package's imports
    upward = sorted((a, b) for a, b in edges if layer(b) > layer(a) and a.split(".")[:2] != b.split(".")[:2])
    assert not upward, upward


def test_the_kit_never_imports_the_iris_layer():
    """The Iris layer is reached through the program hook's entry point (pyproject.toml), never by an import of the
    kit's; nor does the kit name one of its files (a path in code, as kernels/device.py's PASS_THROUGH once did)."""
    edges = module_imports()
    into_iris = sorted((a, b) for a, b in edges if b.startswith("gemmar.iris") and not a.startswith("gemmar.iris"))
    assert any(a.startswith("gemmar.iris") for a, _ in edges) and not into_iris, into_iris
    named = []
    for folder, _, files in os.walk(PACKAGE):
        if os.path.basename(folder) == "iris":
            continue
        for name in (n for n in files if n.endswith(".py")):
            for node in ast.walk(ast.parse(open(os.path.join(folder, name)).read())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "join" and \
                        any(isinstance(a, ast.Constant) and a.value == "iris" for a in node.args):
                    named.append(f"{name}: os.path.join(..., 'iris', ...)")
    assert not named, named


def test_no_import_cycle():
    graph = collections.defaultdict(set)
    for a, b in module_imports():
        if a != b:
            graph[a].add(b)
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                pytest.fail(f"import cycle: {' -> '.join(path + [node, nxt])}")
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = "done"

    for node in list(graph):
        if node not in state:
            visit(node, [])


def test_the_package_never_imports_the_lab():
    """Issue 59: the lab (lab/: models only benchmarks use, run records) sits outside the package, and no arrow
    goes from the kit into it: no module of gemmar imports ``lab`` or reads a file under lab/."""
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in (n for n in files if n.endswith(".py")):
            path = os.path.join(folder, name)
            source = open(path).read()
            for node in ast.walk(ast.parse(source)):
                imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                found += [f"{os.path.relpath(path, PACKAGE)}: import {m}" for m in imported
                          if m == "lab" or m.startswith("lab.")]
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        (node.value == "lab" or node.value.startswith(("lab/", "lab."))):
                    found.append(f"{os.path.relpath(path, PACKAGE)}: {node.value!r}")
    assert not found, found
    assert os.path.exists(os.path.join(PACKAGE, "..", "lab", "models", "allreduce_model.py"))   # (the lab is there)
