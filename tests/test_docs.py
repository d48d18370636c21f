"""The docs name what exists (docs/architecture.md's file map, data/README.md's index, BENCHMARKS.md's rows) and
repeat no current figure, the benchmarks use names that exist, and the code passes the linter CI runs."""

import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_in_map():
    """Paths (relative to the repository) of the modules docs/architecture.md's map names: a line that starts with
    ``folder/`` opens that folder for the lines indented under it; every ``name.py`` on a line belongs to the
    folder of the entry it describes."""
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    block = text.split("## File map", 1)[1].split("```", 2)[1]
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


@pytest.mark.parametrize("folder, least", [("data", 10), ("lab/data", 60)])
def test_the_data_indexes_list_every_file_and_only_those(folder, least):
    """data/ holds what code, tests or notebooks read; lab/data/ the run records nothing loads (issue 52)."""
    folder = os.path.join(ROOT, folder)
    listed = set(re.findall(r"^\| `([^`]+)` \|", open(os.path.join(folder, "README.md")).read(), re.MULTILINE))
    present = set(os.listdir(folder)) - {"README.md"}
    assert len(listed) > least   # the parse found the table
    assert not sorted(present - listed), f"files {folder}/README.md does not list: {sorted(present - listed)}"
    assert not sorted(listed - present), f"{folder}/README.md lists files that are not there: {sorted(listed - present)}"


def test_the_code_passes_the_linter():
    """ruff, with the rules in pyproject.toml ([tool.ruff]), over the whole repository."""
    import sys

    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", ROOT], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-1000:]


# Results live in two places (issue 59): BENCHMARKS.md's "Current figures" table (today's figure of each thing,
# with its command, date and machine) and lab/ (history and records). A page that speaks of a result links to
# the table's row (``BENCHMARKS.md#anchor``) instead of repeating its figures, so a new measurement changes one row.
BENCHMARKS_LINK = re.compile(r"BENCHMARKS\.md#([\w-]+)")


def current_figures():
    """BENCHMARKS.md's "Current figures" table: {row anchor: figure cell}; every row has an anchor."""
    text = open(os.path.join(ROOT, "BENCHMARKS.md")).read()
    table = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith(("| what", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            anchor = re.match(r'<a id="([\w-]+)"></a>', cells[0])
            assert anchor, f"a row of BENCHMARKS.md's current table has no anchor: {cells[0][:60]!r}"
            rows[anchor.group(1)] = cells[1]
    return rows


def notebook_text(name):
    """A notebook's markdown, as one line of words."""
    import json

    cells = json.load(open(os.path.join(ROOT, "notebooks", name)))["cells"]
    return " ".join(" ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").split())


def result_pages():
    """(page, text) of every page a reader goes to for what gemmar does: README, lab/README.md, docs/ (but
    docs/decisions.md, which keeps the dated figures that set each constant with the runs they came from) and
    the notebooks' markdown."""
    pages = ["README.md", "lab/README.md"] + [f"docs/{name}" for name in sorted(os.listdir(os.path.join(ROOT, "docs")))
                                              if name.endswith(".md") and name != "decisions.md"]
    found = [(page, open(os.path.join(ROOT, page)).read()) for page in pages]
    return found + [(f"notebooks/{name}", notebook_text(name))
                    for name in sorted(os.listdir(os.path.join(ROOT, "notebooks"))) if name.endswith(".ipynb")]


def test_every_link_to_a_benchmarks_row_finds_the_row():
    rows = current_figures()
    assert len(rows) > 5   # the parse found the table
    pages = result_pages() + [("docs/decisions.md", open(os.path.join(ROOT, "docs", "decisions.md")).read())]
    links = [(page, anchor) for page, text in pages for anchor in BENCHMARKS_LINK.findall(text)]
    assert len({page for page, _ in links}) >= 5, links   # README, docs/backends.md, decisions.md, notebooks 5, 6
    missing = sorted(f"{page}: BENCHMARKS.md#{anchor}" for page, anchor in links if anchor not in rows)
    assert not missing, f"links to rows BENCHMARKS.md does not have (its anchors: {sorted(rows)}): {missing}"


def quoted_forms(cell):
    """The ways a page would quote a figure cell: each number of two or more decimals as written and to two
    decimals, and the range of them (``0.63-0.93``)."""
    numbers = re.findall(r"(?<![\w.])\d+\.\d{2,}(?!\w)", cell)
    forms = set(numbers) | {f"{float(n):.2f}" for n in numbers}
    if len(numbers) > 1:
        forms.add(f"{min(map(float, numbers)):.2f}-{max(map(float, numbers)):.2f}")
    return forms


def test_no_page_repeats_a_current_figure():
    rows = current_figures()
    repeated = []
    for anchor, cell in rows.items():
        for form in quoted_forms(cell):
            for page, text in result_pages():
                for found in re.finditer(rf"(?<![\d.]){re.escape(form)}(?!\d)", text):
                    repeated.append(f"{page}: {text[max(0, found.start() - 50):found.end() + 20]!r} "
                                    f"(BENCHMARKS.md#{anchor}: link the row instead)")
    assert sum(len(quoted_forms(cell)) for cell in rows.values()) > 50   # (the figures were read)
    assert not repeated, "\n".join(repeated)


def test_numbers_in_the_notebooks_text_are_the_codes():
    """Issue 37: a number a notebook's text states, where code or data holds it, is what they hold (the model's
    link and NCCL speeds, its tolerance, how many figures it is checked on)."""
    from gemmar.analysis import model

    import dataclasses

    text = notebook_text("05_gpu_traces.ipynb")
    defaults = {f.name: f.default for f in dataclasses.fields(model.Machine)}
    assert f"({defaults['link_gb_s']:g} GB/s per direction)" in text
    assert f"({defaults['nccl_bus_gb_s']:g} GB/s)" in text
    assert f"within {100 * model.TOLERANCE:g} %" in text
    measured, checked, one_gpu = model.load_inputs(*(os.path.join(model.MEASURED, name)
                                                     for name in model.CHECKED_AGAINST[:2]))
    figures = len(model.check(measured, 2, checked, one_gpu))
    words = {9: "nine", 6: "six", 12: "twelve"}
    assert f"reproduce the {words.get(figures, figures)} figures measured on 2 x H200" in text, figures


# Measured figures belong with their runs in docs/decisions.md, not in the package's code (workshop dry run 3,
# "the kit apart from the lab"): no GPU model, no date, no citation of BENCHMARKS.md in gemmar's Python files;
# a constant's comment points to its section of docs/decisions.md instead, and that section exists.
FIGURE_MARKS = re.compile(r"\b(H100|H200|A100)\b|\b20\d\d-[01]\d-[0-3]\d\b|BENCHMARKS\.md")


def package_python():
    for folder, _, files in os.walk(os.path.join(ROOT, "gemmar")):
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def test_the_package_code_holds_no_figures_dates_or_machines():
    found = [f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}" for path in package_python()
             for number, line in enumerate(open(path), 1) if FIGURE_MARKS.search(line)]
    assert not found, "measured figures belong in docs/decisions.md:\n" + "\n".join(found)
    # Issue 52's own check, over every file of the package (its measured runs too: their machine and date are in
    # docs/decisions.md): grep -rn "H200\|20[0-9][0-9]-" gemmar/
    grep = subprocess.run(["grep", "-rn", "-I", r"H200\|20[0-9][0-9]-", "gemmar/"], cwd=ROOT, capture_output=True,
                          text=True)
    assert grep.returncode == 1 and not grep.stdout, grep.stdout


def test_every_pointer_to_docs_decisions_names_one_of_its_sections():
    decisions = open(os.path.join(ROOT, "docs", "decisions.md")).read()
    sections = [line.lstrip("#").strip().lower() for line in decisions.splitlines() if line.startswith("#")]
    pointers = 0
    for path in package_python():
        # (comments and docstrings broken over lines read as one line of words)
        text = " ".join(line.strip().lstrip("#").strip() for line in open(path))
        for name in re.findall(r"docs/decisions\.md, ([^).;:\"]+)", text):
            pointers += 1
            name = name.strip().rstrip(",").lower()
            assert any(section.startswith(name) for section in sections), \
                f"{os.path.relpath(path, ROOT)} points to docs/decisions.md, {name!r}: no such section"
    assert pointers > 20   # (the parse found them)


def test_every_benchmark_script_the_docs_name_exists():
    """Scripts were renamed by what they measure (issue 52): a page that still names an old one sends a reader
    to nothing. (Names inside lab/'s history are as they were on the day, and say so.)"""
    pages = ["README.md", "BENCHMARKS.md", "data/README.md", "lab/data/README.md"] + \
        [os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))]
    named = {(page, path) for page in pages
             for path in re.findall(r"benchmarks/[\w.-]+\.(?:sh|py)\b", open(os.path.join(ROOT, page)).read())}
    assert len(named) > 10   # (the pages were read)
    missing = sorted(f"{page}: {path}" for page, path in named if not os.path.exists(os.path.join(ROOT, path)))
    assert not missing, missing


def test_environment_yml_holds_every_package_pyproject_names():
    """Issue 61: environment.yml (conda users) lacked the test extra's playwright, ruff and nbformat."""
    import tomllib

    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    wanted = project["dependencies"] + [p for extra in project["optional-dependencies"].values() for p in extra]
    names = {re.match(r"[A-Za-z0-9_.-]+", p).group(0).lower() for p in wanted}
    listed = {re.match(r"\s*-\s*([A-Za-z0-9_.-]+)", line).group(1).lower()
              for line in open(os.path.join(ROOT, "environment.yml")) if re.match(r"\s*-\s*[A-Za-z]", line)}
    assert names <= listed, f"environment.yml lacks {sorted(names - listed)}"


def test_the_kernel_lines_notebook_3_names_are_the_ones_it_describes():
    """Notebook 3 names the ring kernel's lines the sanitizer reports (file:line): they must still be the slot's
    read and store (they were off by 10-14 lines until issue 61)."""
    text = notebook_text("03_ring_lock_handoff.ipynb")
    found = re.search(r"`ring\.py:(\d+)` is step 4's read of the slot and `ring\.py:(\d+)` step 2's store", text)
    assert found, "notebook 3 no longer names the two lines"
    lines = open(os.path.join(ROOT, "gemmar", "kernels", "ring.py")).read().splitlines()
    read, store = (lines[int(n) - 1].strip() for n in found.groups())
    assert read.startswith("received = tl.load(slot") and store.startswith("device.store(slot, payload"), (read, store)


def module_file(module):
    """The file of a module of the package or the lab (``gemmar.runtime.launch``, ``lab.models.few_rows``), or None."""
    base = os.path.join(ROOT, *module.split("."))
    return next((p for p in (base + ".py", os.path.join(base, "__init__.py")) if os.path.exists(p)), None)


def module_names(path):
    """The names a module defines at its top level (functions, classes, assignments, imports); None if it makes
    names on demand (a module ``__getattr__``, as gemmar/__init__.py)."""
    import ast

    names, todo = set(), list(ast.parse(open(path).read()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []) + \
                [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


def test_the_benchmarks_use_what_the_package_and_the_lab_have():
    """Issue 59: nothing runs benchmarks/ in CI (most need GPUs), so a name the package or the lab moved or
    renamed would break a script unseen. Every ``from gemmar... import name``, ``from lab... import name`` and
    ``module.name`` of an imported module in benchmarks/*.py and lab/ must exist (read from the sources, no GPU)."""
    import ast

    scripts = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py")) +
                     glob.glob(os.path.join(ROOT, "lab", "**", "*.py"), recursive=True))
    missing, checked = [], 0
    for script in scripts:
        tree = ast.parse(open(script).read())
        where = os.path.relpath(script, ROOT)
        modules = {}   # a name bound to a module of the package or the lab -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in ("gemmar", "lab"):
                        if not module_file(a.name):
                            missing.append(f"{where}: import {a.name}")
                        modules[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and not node.level and \
                    (node.module or "").split(".")[0] in ("gemmar", "lab"):
                path = module_file(node.module)
                if not path:
                    missing.append(f"{where}: from {node.module}")
                    continue
                names = module_names(path)
                for a in node.names:
                    checked += 1
                    if module_file(f"{node.module}.{a.name}"):
                        modules[a.asname or a.name] = f"{node.module}.{a.name}"
                    elif names is not None and a.name not in names:
                        missing.append(f"{where}: from {node.module} import {a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                module = modules[node.value.id]
                names = module_names(module_file(module))
                checked += 1
                if names is not None and node.attr not in names and not module_file(f"{module}.{node.attr}"):
                    missing.append(f"{where}: {module}.{node.attr}")
    assert checked > 50   # (the scripts were read)
    assert not missing, sorted(set(missing))


def test_every_test_run_alone_is_a_test_of_the_suite():
    """conftest.ALONE names files and tests by name: a renamed test would quietly go back to the workers."""
    from conftest import ALONE

    for entry in ALONE:
        file, _, test = entry.partition("::")
        with open(os.path.join(ROOT, "tests", file)) as f:
            source = f.read()
        assert not test or f"def {test}(" in source, f"{entry}: no such test"
