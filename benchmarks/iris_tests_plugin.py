"""A pytest plugin that ``benchmarks/iris_tests.py`` loads into Iris's own test suite on every rank (``-p
iris_tests_plugin``): it records each case's outcome as it happens and skips the AMD-only parts, each with one line.

- Every report is appended at once to ``$GEMMAR_IRIS_RESULTS/rank<R>.jsonl`` (node id, phase, outcome, the first
  line of the failure), and the collected node ids to ``rank<R>.collected``: a rank that dies mid-run loses nothing
  that ran, and the cases it never reached are known.
- AMD-only files (Gluon kernels, HIP, vmem/dmabuf import, ROCr behaviour) are not collected: importing them needs
  Iris's AMD modules. The script counts their test functions and prints them with the reason below.
- Cases elsewhere that call ``as_symmetric`` (Iris's vmem allocator maps a tensor's own memory into its heap), and
  the few that test Iris's internal tuning tables (``INTERNAL_TESTS``), are skipped with their reason.
Nothing here changes what a case checks.
"""

import json
import os
import re

import pytest

# (pattern on the file's path inside the Iris checkout, why it cannot run on gemmar's ranks)
AMD_ONLY_FILES = [
    (r"gluon", "AMD-only: Gluon kernels (Triton's gluon dialect, as Iris uses it on ROCm)"),
    (r"(^|/)test_(hip_|rocr_)", "AMD-only: HIP runtime calls (hipMemGetAddressRange, ROCr)"),
    (r"vmem", "AMD-only: Iris's vmem allocator (HIP virtual memory)"),
    (r"dmabuf|test_pytorch_import_mechanism", "AMD-only: dmabuf export/import of GPU memory through HIP"),
    (r"(^|/)test_(topology|drivers)\.py$",
     "Iris's internals: its topology discovery and fabric-driver classes (iris.host.distributed.topology, "
     "iris.drivers), not an API a program calls"),
]
AS_SYMMETRIC = "AMD-only: as_symmetric maps a tensor's own memory into the heap (Iris's vmem allocator)"
# Test functions of files that run, which test Iris's internals rather than its API: (name pattern, reason)
INTERNAL_TESTS = [(r"^test_auto_config", "Iris's internals: the launch-heuristic table of its MI300X hbm-buffer kernel "
                   "(_auto_config, _CHAMPION_CONFIGS), not an API a program calls")]


def amd_only_reason(path):
    """The reason a test file is not run on gemmar's ranks, or None."""
    path = str(path).replace(os.sep, "/")
    for pattern, reason in AMD_ONLY_FILES:
        if re.search(pattern, path.rsplit("/tests/", 1)[-1]):
            return reason
    return None


def _out(name):
    folder = os.environ.get("GEMMAR_IRIS_RESULTS")
    if not folder:
        return None
    return os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.{name}")


def pytest_ignore_collect(collection_path, config):
    if collection_path.suffix == ".py" and amd_only_reason(collection_path):
        return True
    return None


TOO_LARGE = ("too large for the Triton interpreter in this run: a dimension over $GEMMAR_IRIS_MAX_DIM (Iris's own "
             "kernels take minutes per case at 8192 x 8192 on cpu ranks)")
DIMENSIONS = {"m", "n", "k", "size", "n_elements", "num_elements"}


def _too_large(item):
    limit = int(os.environ.get("GEMMAR_IRIS_MAX_DIM") or 0)
    params = getattr(getattr(item, "callspec", None), "params", {})
    dims = [v for name, v in params.items() if name.lower() in DIMENSIONS and isinstance(v, int)]
    dims += [d for v in params.values() if isinstance(v, tuple) for d in v if isinstance(d, int)]
    return limit and any(d > limit for d in dims)


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        if _too_large(item):
            item.add_marker(pytest.mark.skip(reason=TOO_LARGE))
        source = getattr(getattr(item, "function", None), "__code__", None)
        names = source.co_names if source is not None else ()
        if "as_symmetric" in names and not os.environ.get("GEMMAR_IRIS_REAL"):   # (a real Iris copies, as its torch
            # allocator does; gemmar's stand-in refuses)
            item.add_marker(pytest.mark.skip(reason=AS_SYMMETRIC))
        for pattern, reason in INTERNAL_TESTS:
            if re.search(pattern, getattr(item, "originalname", item.name)):
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_finish(session):
    """The cases this rank will run: after ``-k``/``-m`` deselected theirs (those are not cases of this run)."""
    path = _out("collected")
    if path:
        with open(path, "w") as f:
            f.write("".join(item.nodeid + "\n" for item in session.items))


def _first_line(report):
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:400]


def pytest_runtest_logreport(report):
    path = _out("jsonl")
    if not path or (report.when != "call" and report.passed):
        return
    record = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
              "message": _first_line(report), "seconds": round(report.duration, 3)}
    with open(path, "a") as f:   # one line a report, flushed as it happens
        f.write(json.dumps(record) + "\n")


def pytest_collectreport(report):
    path = _out("jsonl")
    if path and report.failed:   # a file that could not be imported: its cases never ran
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "when": "collect", "outcome": "failed",
                                "message": _first_line(report), "seconds": 0}) + "\n")
