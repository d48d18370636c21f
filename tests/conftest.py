"""Shared fixtures: real ipyparallel clusters, started once per world size and reused by the tests."""

import atexit
import os
import shutil
import sys
import tempfile

import pytest

# Tests never write into the user's home: what would go there (JupyterLab's workspaces and runtime files,
# Triton's compile cache, matplotlib's settings, a browser profile) goes to a private folder instead,
# removed at the end. Set before anything starts a process, so every process of the run inherits it.
TEST_HOME = tempfile.mkdtemp(prefix="gemmar-tests-home-")
os.environ["HOME"] = TEST_HOME
atexit.register(shutil.rmtree, TEST_HOME, ignore_errors=True)

import gemmar  # noqa: E402 - after HOME is private

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


# GEMMAR_TEST_BACKEND=cuda runs the same validation compiled on GPUs; world sizes above the GPU count run
# with the ranks sharing GPU 0 (one engine, a stream per rank).
BACKEND = os.environ.get("GEMMAR_TEST_BACKEND", "cpu")


class Clusters:
    """Start a cluster of a given world size on first use; stop them all at the end of the session."""

    def __init__(self):
        self.by_size = {}

    def __call__(self, world_size):
        cluster = self.by_size.get(world_size)
        if cluster is None or not cluster.running:
            # Clusters of different sizes live side by side (each its own engines, store and NCCL group):
            # a compiled cluster takes many seconds to start, and the tests alternate between sizes.
            cluster = gemmar.Cluster(world_size=world_size, backend=BACKEND, timeout_s=60)
            self.by_size[world_size] = cluster
        return cluster

    def close(self):
        for cluster in self.by_size.values():
            cluster.stop()


# Test tiers, by file (README, "Run the tests"); a file not named here is in the fast tier, which is everything
# but slow, system, notebook and browser tests (`pytest -m "not (slow or system or notebook or browser)"`).
# "slow": stress and randomized runs, compiling for sm_90, the widgets, the Iris-style programs of 3b4c197's
# era, the README's own commands. Times per file: pytest --durations=0.
TIERS = {"test_browser": "browser", "test_notebooks": "notebook",
         "test_lifecycle": "system", "test_faults": "system", "test_programs_end_with_their_run": "system", "test_limits_are_named_in_one_line": "system",
         "test_reports_are_written_whole_or_not_at_all": "system", "test_cli": "system", "test_shared_server": "system",
         "test_reliability": "slow", "test_compile": "slow", "test_explorer": "slow", "test_iris_programs": "slow",
         "test_readme": "slow"}


# Tests that time something live on this machine's CPUs against a bound (an exercise's measured waits, a Ctrl-C or
# a death named within seconds), and the shared server's, whose attacker scans every port of the machine (the other
# worker's Jupyter kernels listen unencrypted): README's test command runs them after the others, alone, so that
# the other worker's load is not in their figures (`-m alone`; the rest in two workers, `-m "not alone"`). By file,
# or file::test.
ALONE = ("test_explorer.py", "test_shared_server.py",
         "test_user_algorithm.py::test_a_wrong_wait_in_a_users_algorithm_is_named_within_15_s", "test_browser.py::test_explorer_in_jupyterlab_redraws_after_run_and_stops_when_interrupted",
         "test_faults.py::test_a_killed_rank_is_an_error_within_two_seconds_and_the_next_call_restarts",
         "test_faults.py::test_a_frozen_rank_is_an_error_within_seconds",
         "test_faults.py::test_an_interrupted_rank_and_an_exiting_rank",
         "test_lifecycle.py::test_ctrl_c_ends_a_cli_run_at_once_in_one_line",
         "test_lifecycle.py::test_an_interrupted_call_stops_its_ranks_and_the_next_call_restarts_them",
         "test_lifecycle.py::test_stop_from_another_thread_ends_the_run_at_once",
         "test_sanitizer.py::test_a_large_host_fill_is_one_record_of_byte_ranges")


# Seconds each file's tests took in one of two xdist workers on 2 cores (`-m "not alone" --durations=0`, call + setup +
# teardown, 2026-12-07 at 715c60f); a file not named here counts as FILE_SECONDS_UNKNOWN. Only the order the files are
# handed out in depends on them (pytest_xdist_make_scheduler below), never what runs: stale figures cost balance only.
FILE_SECONDS = {"test_browser.py": 328, "test_exercises.py": 320, "test_kernels.py": 238, "test_notebooks.py": 210,
                "test_reliability.py": 129, "test_programs_end_with_their_run.py": 123, "test_compile.py": 122,
                "test_lifecycle.py": 116, "test_sanitizer.py": 105, "test_allreduce.py": 104, "test_cli.py": 85,
                "test_limits_are_named_in_one_line.py": 78, "test_iris_today.py": 69, "test_iris_programs.py": 69,
                "test_cluster.py": 65, "test_readme.py": 64, "test_user_algorithm.py": 44, "test_faults.py": 41,
                "test_iris_suite_causes.py": 35, "test_trace.py": 31, "test_reports_are_written_whole_or_not_at_all.py": 20,
                "test_real_iris_host.py": 19, "test_compiled_launch.py": 16, "test_trace_files.py": 15, "test_docs.py": 8,
                "test_mistakes.py": 7, "test_layers.py": 7, "test_config.py": 4, "test_interpreter_patched_only_in_gemmar.py": 3,
                "test_device_api.py": 1, "test_casts.py": 1, "test_checks.py": 1, "test_model.py": 1, "test_program_hooks.py": 1,
                "test_tuning_cache.py": 1, "test_iris_backend.py": 1}
FILE_SECONDS_UNKNOWN = 20


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, longest files first. xdist hands out files by their number of tests, most first, so a file
    of one long test (test_compile.py: one test, 2 minutes) or a few (test_browser.py) came last, and one worker ran
    on alone at the end; handed out longest first, the short files at the end even the two workers out."""
    if config.getvalue("dist") != "loadfile":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(OrderedDict):
        # The scheduler's queue of files: it takes the next one with popitem(last=False) (xdist 3.x).
        def popitem(self, last=True):
            if last or not self:
                return super().popitem(last)
            scope = max(self, key=lambda scope: FILE_SECONDS.get(os.path.basename(scope), FILE_SECONDS_UNKNOWN))
            return scope, self.pop(scope)

    scheduler = LoadFileScheduling(config, log)
    if isinstance(getattr(scheduler, "workqueue", None), OrderedDict):   # (another xdist: its own order, as before)
        scheduler.workqueue = LongestFirst(scheduler.workqueue)
    return scheduler


def pytest_collection_modifyitems(items):
    """Mark each test with its tier (and "cluster" where it uses real engines); then tests without a
    world_size parameter first, then by world size: fewer clusters alive at a time."""
    for item in items:
        where = f"{item.path.name}::{item.originalname}"
        if any(where == alone or where.startswith(alone + "::") for alone in ALONE):
            item.add_marker("alone")
        tier = TIERS.get(item.path.stem)
        if tier:
            item.add_marker(tier)
        elif "clusters" in getattr(item, "fixturenames", ()):
            item.add_marker("cluster")
        else:
            item.add_marker("unit")
    items.sort(key=lambda item: item.callspec.params.get("world_size", 0) if hasattr(item, "callspec") else 0)


if BACKEND == "cuda":
    # A compiled example costs seconds (and a cluster start when the world size changes): report the
    # failing example as found, without hypothesis' shrinking runs.
    from hypothesis import Phase, settings

    settings.register_profile("compiled", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("compiled")


@pytest.fixture(scope="session")
def clusters():
    # Engines import test helpers (tests/rank_helpers.py) by module name: through PYTHONPATH, which every engine
    # inherits, also those a cluster starts anew after a rank was stopped (a bounds error, a crash).
    sys.path.insert(0, TESTS_DIR)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([TESTS_DIR] + ([before] if before else []))
    registry = Clusters()
    yield registry
    registry.close()
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before


@pytest.fixture(autouse=True)
def close_figures():
    """Figures a test drew and left open are closed after it: a worker runs many files' tests in one process, and
    pyplot keeps every open figure (matplotlib warns past 20)."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")
