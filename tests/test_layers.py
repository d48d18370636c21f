"""The package's layers, from its own imports: no module imports from a layer above it, and no cycle.

client (cluster, cli, commands, outputs, console, exercises, explorer, report, progress, __init__) -> runtime, analysis
-> config, algorithms (the registry of specs), sanitizer -> kernels (with each algorithm's spec) -> errors
"""

import ast
import collections
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gemmar")
LAYER = {"__init__": 5, "__main__": 5, "cluster": 4, "cli": 4, "commands": 4, "outputs": 4, "console": 4, "exercises": 4, "partial_counts": 4, "progress": 4,
         "explorer": 4, "report": 4, "iris": 4, "runtime": 3, "analysis": 3, "sanitizer": 2, "algorithms": 2, "config": 2,
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


# Sizes agreed for the package (issue 38): a module a reader can hold, a function that fits on a screen.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def test_no_module_or_function_is_too_long_to_read():
    too_long = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            source = open(path).read()
            where = os.path.relpath(path, os.path.dirname(PACKAGE))
            if source.count("\n") > MAX_MODULE_LINES:
                too_long.append(f"{where}: {source.count(chr(10))} lines (at most {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines (at most "
                                        f"{MAX_FUNCTION_LINES})")
    assert not too_long, too_long
