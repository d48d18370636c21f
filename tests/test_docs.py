"""The docs name what exists (docs/architecture.md's file map, data/README.md's index), and the code passes the
linter CI runs."""

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


# Figures quoted outside BENCHMARKS.md that cite a row of its "Current figures" table: the row (by the start of
# its first cell), a pattern over its figure cell, and where each quote is, written from the pattern's groups.
# A new measurement changes the row; then these quotes must change with it, or this test fails.
CITED_FIGURES = [
    ("two_shot across GPUs", r"(\d\.\d+), (\d\.\d+), (\d\.\d+) at 8192",
     lambda g: f"{min(map(float, g)):.2f}-{max(map(float, g)):.2f}x",
     [("README.md", "On 2 x H200 {}"), ("docs/decisions.md", "two_shot measured {} cuBLAS"),
      ("docs/backends.md", "on 2 x H200, {} the time of cuBLAS then NCCL")]),
    ("the same at inference shapes", r"two_shot (\d\.\d+) \(M 4096\), (\d\.\d+) \(1024\), (\d\.\d+) \(256\), "
                                     r"(\d\.\d+) \(64\), (\d\.\d+) \(16\)",
     lambda g: f"{min(map(float, g)):.2f}-{max(map(float, g)):.2f}x",
     [("README.md", "and {} at five inference shapes"), ("docs/decisions.md", "and {} at five of 16-4096")]),
    ("two_shot at one rank, / torch.matmul then nothing to reduce", r"^(\d\.\d\d-\d\.\d\d) ",
     lambda g: f"{g[0]}x", [("docs/backends.md", "at one rank two_shot is {} torch.matmul")]),
    ("two_shot at one rank, few rows",
     r"^\d\.\d\d-(\d\.\d\d) at every shape, (\d\.\d\d) at 8192 x 8192 x 8192 \(one run",
     lambda g: f"{g[1]}-{g[0]}x torch.matmul's time at 16-8192 rows in one run",
     [("docs/decisions.md", "two_shot measured {}")]),
]


def current_figures():
    """BENCHMARKS.md's "Current figures" table: first cell -> figure cell."""
    text = open(os.path.join(ROOT, "BENCHMARKS.md")).read()
    table = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| what") and not line.startswith("|---")]
    return {row[0]: row[1] for row in rows}


def test_figures_quoted_in_code_and_docs_are_the_current_ones():
    rows = current_figures()
    assert len(rows) > 5   # the parse found the table
    for row_start, pattern, quote, places in CITED_FIGURES:
        cells = [cell for first, cell in rows.items() if first.startswith(row_start)]
        assert len(cells) == 1, f"BENCHMARKS.md's current table has no one row starting {row_start!r}"
        found = re.search(pattern, cells[0])
        assert found, f"the row {row_start!r} no longer reads as {pattern!r}: {cells[0]!r}"
        for path, template in places:
            # (Python strings broken over lines read as one: quotes and line breaks between the parts dropped.)
            text = " ".join(open(os.path.join(ROOT, path)).read().split())
            text = re.sub(r'"\s+"', "", text)
            expected = template.format(quote(found.groups()))
            assert expected in text, f"{path} should quote {expected!r} (BENCHMARKS.md, current figures: {row_start})"


def notebook_text(name):
    """A notebook's markdown, as one line of words."""
    import json

    cells = json.load(open(os.path.join(ROOT, "notebooks", name)))["cells"]
    return " ".join(" ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").split())


def test_numbers_in_the_notebooks_text_are_the_codes_and_the_current_tables():
    """Issue 37: a number a notebook's text states, where code or data holds it, is what they hold (the model's
    link and NCCL speeds, its tolerance, how many figures it is checked on; two_shot's 2 x H200 range)."""
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
    rows = current_figures()
    large = next(cell for first, cell in rows.items() if first.startswith("two_shot across GPUs"))
    small = next(cell for first, cell in rows.items() if first.startswith("the same at inference shapes"))
    ratios = [float(x) for x in re.search(r"(\d\.\d+), (\d\.\d+), (\d\.\d+) at 8192", large).groups()]
    ratios += [float(x) for x in re.search(r"two_shot (\d\.\d+) \(M 4096\), (\d\.\d+) \(1024\), (\d\.\d+) \(256\), "
                                            r"(\d\.\d+) \(64\), (\d\.\d+) \(16\)", small).groups()]
    for notebook in ("05_gpu_traces.ipynb", "06_two_shot.ipynb"):
        assert f"on 2 x H200 it took {min(ratios):.2f}-{max(ratios):.2f}x their time" in notebook_text(notebook)
    # (issue 61: notebook 5 said two_shot had never run on two GPUs)
    assert f"two_shot was measured on 2 x H200 ({ratios[0]:.2f}, {ratios[1]:.2f} and {ratios[2]:.2f} of the faster" \
        in text


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
