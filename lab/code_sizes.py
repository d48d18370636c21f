"""How long the package's modules and functions are, longest first: a report for a reader planning a split, not a
cap (a cap once forced splits by size, not by idea: issue 59).

    python -m lab.code_sizes [--top N]     (from the repository root)
"""

import argparse
import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gemmar")
# What issue 38 agreed a reader can hold: a module of about 400 lines, a function that fits on a screen (60).
MODULE_LINES, FUNCTION_LINES = 400, 60


def sizes():
    """([(lines, module path)], [(lines, 'path:line name')]) for every module and function of the package."""
    modules, functions = [], []
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(n for n in files if n.endswith(".py")):
            path = os.path.join(folder, name)
            source = open(path).read()
            where = os.path.relpath(path, os.path.dirname(PACKAGE))
            modules.append((source.count("\n"), where))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    functions.append((node.end_lineno - node.lineno + 1, f"{where}:{node.lineno} {node.name}"))
    return sorted(modules, reverse=True), sorted(functions, reverse=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="how many of each to list (default %(default)s)")
    top = parser.parse_args().top
    modules, functions = sizes()
    for what, items, over in (("modules", modules, MODULE_LINES), ("functions", functions, FUNCTION_LINES)):
        longer = sum(1 for lines, _ in items if lines > over)
        print(f"{len(items)} {what}, {sum(lines for lines, _ in items)} lines; {longer} over {over} lines")
        for lines, where in items[:top]:
            print(f"  {lines:5d}  {where}")


if __name__ == "__main__":
    main()
