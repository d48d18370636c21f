"""The docs name what exists (ARCHITECTURE.md's file map, data/README.md's index), and the code passes the
linter CI runs."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_in_map():
    """Paths (relative to the repository) of the modules ARCHITECTURE.md's map names: a line that starts with
    ``folder/`` opens that folder for the lines indented under it; every ``name.py`` on a line belongs to the
    folder of the entry it describes."""
    text = open(os.path.join(ROOT, "ARCHITECTURE.md")).read()
    block = text.split("```", 2)[1]
    named, folders, current = set(), [], ""
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        if first.endswith("/") or first.endswith(".py"):   # an entry; else a description's next line
            folders = [(i, f) for i, f in folders if i < indent]
            current = "".join(f for _, f in folders)
            if first.endswith("/"):
                folders.append((indent, first))
                current += first
        named.update(current + name for name in re.findall(r"(?<![\w/.])(\w+\.py)\b", line))
    return named


def test_the_architecture_map_lists_every_module_and_only_those():
    on_disk = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "gemmar")):
        for name in files:
            path = os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
            if name.endswith(".py") and (name != "__init__.py" or path == "gemmar/__init__.py"):
                on_disk.add(path)
    named = modules_in_map()
    assert len(named) > 40   # the parse found the map
    assert not sorted(on_disk - named), f"modules the map does not list: {sorted(on_disk - named)}"
    assert not sorted(named - on_disk), f"the map names modules that do not exist: {sorted(named - on_disk)}"


def test_the_data_index_lists_every_file_and_only_those():
    folder = os.path.join(ROOT, "data")
    listed = set(re.findall(r"^\| `([^`]+)` \|", open(os.path.join(folder, "README.md")).read(), re.MULTILINE))
    present = set(os.listdir(folder)) - {"README.md"}
    assert len(listed) > 20   # the parse found the table
    assert not sorted(present - listed), f"files data/README.md does not list: {sorted(present - listed)}"
    assert not sorted(listed - present), f"data/README.md lists files that are not there: {sorted(listed - present)}"


def test_the_code_passes_the_linter():
    """ruff, with the rules in pyproject.toml ([tool.ruff]), over the whole repository."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", ROOT], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-1000:]
