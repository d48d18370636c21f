"""Cluster life cycle: start, stop, restart, no leftovers; clear errors; two clusters side by side."""

import os
import time

import psutil
import pytest
import torch

import gemmar
from gemmar.runtime.heap import shm_dir
from inputs import loose_gemmar_files, random_inputs, reference, wait_until


def gemmar_files():
    return [f for f in os.listdir(shm_dir()) if f.startswith("gemmar-")]


@pytest.mark.slow   # (out of the fast tier: README, "Run the tests")
def test_heap_files_are_gone_once_ranks_are_up_and_engines_gone_after_stop():
    # (this cluster's own folders, and no loose file: inputs.loose_gemmar_files says why)
    before = set(gemmar_files())
    cluster = gemmar.Cluster(world_size=2, backend="cpu")
    folders = [cluster.heap_folder]
    try:
        # Each rank unlinks its file as soon as every rank has mapped it; the cluster's private folder stays.
        assert os.path.basename(cluster.heap_folder) in gemmar_files()
        assert not [name for name in os.listdir(cluster.heap_folder) if name.startswith("rank")]
        assert not loose_gemmar_files(before)
        pids = list(cluster.pids)
        assert all(psutil.pid_exists(p) for p in pids)
        cluster.restart()
        assert cluster.running and cluster.pids != pids
        pids += cluster.pids
        folders.append(cluster.heap_folder)
    finally:
        cluster.stop()
    assert not cluster.running
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not [folder for folder in folders if os.path.exists(folder)]
    assert not loose_gemmar_files(before)


@pytest.mark.slow   # (out of the fast tier: README, "Run the tests")
def test_two_clusters_at_once_do_not_interfere():
    A, B = random_inputs(32, 32, 32, torch.float16, seed=5)
    with gemmar.Cluster(world_size=2, backend="cpu") as one, gemmar.Cluster(world_size=3, backend="cpu") as two:
        assert one.cluster_id != two.cluster_id
        r1 = one.gemm_all_reduce(A, B, algorithm="ring", BLK_M=16, BLK_N=16, BLK_K=16, iterations=2)
        r2 = two.gemm_all_reduce(A, B, algorithm="atomics", BLK_M=16, BLK_N=16, BLK_K=16, iterations=2)
    ref = reference(A, B)
    for r in (r1, r2):
        assert r.ok and (r.C.double() - ref).abs().max() < 1e-2


def test_run_gathers_results_by_rank(clusters):
    from gemmar.runtime.rank import describe

    info = clusters(3).run_ranks(describe)
    assert [i["rank"] for i in info] == [0, 1, 2]
    assert all(i["interpreter"] for i in info)
    assert len({i["pid"] for i in info}) == 3


@pytest.mark.parametrize("kwargs,needle", [
    (dict(world_size=0), "world_size=0"),
    (dict(world_size=2, backend="tpu"), "tpu"),
    (dict(world_size=2, backend="cuda"), "needs an NVIDIA GPU"),
    (dict(world_size=2, timeout_s=0), "timeout_s=0"),
    (dict(world_size=2, start_timeout_s=-1), "start_timeout_s=-1"),
    (dict(world_size=2, heap_size=10), "heap_size=10 is not allowed"),       # the caller lives on
    (dict(world_size=2, heap_size=0), "heap_size=0 is not allowed"),
    (dict(world_size=2, heap_size=10 ** 14), r"needs 182 TiB of shared memory"),
])
def test_bad_cluster_arguments(kwargs, needle):
    with pytest.raises(gemmar.UsageError, match=needle):
        gemmar.Cluster(**kwargs)


def test_bad_inputs_through_the_python_api(clusters):
    cluster = clusters(2)
    A, B = random_inputs(32, 32, 32, torch.float16)
    with pytest.raises(gemmar.UsageError, match="A's columns must equal B's rows"):
        cluster.gemm_all_reduce(A, B[:16])
    with pytest.raises(gemmar.UsageError, match="same dtype"):
        cluster.gemm_all_reduce(A, B.float())
    with pytest.raises(gemmar.UsageError, match="float64"):
        cluster.gemm_all_reduce(A.double(), B.double())
    with pytest.raises(gemmar.UsageError, match="BLK_N=48"):
        cluster.gemm_all_reduce(A, B, BLK_M=16, BLK_N=48, BLK_K=16)
    with pytest.raises(gemmar.UsageError, match="algorithm 'tree'"):
        cluster.gemm_all_reduce(A, B, algorithm="tree")
    with pytest.raises(gemmar.UsageError, match="mistake 'typo'"):
        cluster.gemm_all_reduce(A, B, mistake="typo")
    with pytest.raises(gemmar.UsageError, match="A holds 2 NaN or infinite"):
        bad = A.clone()
        bad[0, 0], bad[3, 1] = float("nan"), float("inf")
        cluster.gemm_all_reduce(bad, B)
    with pytest.raises(gemmar.UsageError, match="device 'meta'"):
        cluster.gemm_all_reduce(A, B.to("meta"))
    with pytest.raises(gemmar.UsageError, match="setting 'block' is not known"):
        cluster.gemm_all_reduce(A, B, block=None)
    # An attacker's third round (issue 51, attack 6): a sparse A, a product that overflows C's dtype (a right
    # kernel writes inf: "the inputs overflow", not a mismatch), a huge expanded view (refused by its shape
    # or size before any value is read), a config that is not a RunConfig.
    with pytest.raises(gemmar.UsageError, match=r"A is a torch.sparse_coo tensor: give a dense one \(A.to_dense\(\)\)"):
        cluster.gemm_all_reduce(A.to_sparse(), B)
    with pytest.raises(gemmar.UsageError, match="the inputs overflow: .A @ B. reaches .* above float16's largest 65504"):
        cluster.gemm_all_reduce(A * 300, B * 300, algorithm="two_shot")
    with pytest.raises(gemmar.UsageError, match=r"\|rank 1's partial product\| reaches .* \(the partials on the wire\)"):
        lopsided = B.float()
        lopsided[16:] *= 1e4   # rank 1's half of K: its partial overflows the fp16 wire, C in fp32 would not
        cluster.gemm_all_reduce(A.float(), lopsided, algorithm="two_shot", wire_dtype="fp16")
    huge = torch.zeros(1, dtype=torch.float16).expand(1 << 20, 1 << 20)
    with pytest.raises(gemmar.UsageError, match="needs about .* of memory"):
        cluster.gemm_all_reduce(huge, huge)
    with pytest.raises(gemmar.UsageError, match=r"config='ring' is not allowed: .*bench\(algorithm='ring'\)"):
        cluster.bench(config="ring")
    # Large inputs give large rounding errors; the tolerance scales with |a| |b|, so a right C passes.
    big_A, big_B = (A.float() * 100).half(), (B.float() * 100).half()
    assert cluster.gemm_all_reduce(big_A, big_B, BLK_M=16, BLK_N=16, BLK_K=16).ok
    # The cluster is still usable after each refusal.
    assert cluster.gemm_all_reduce(A, B, BLK_M=16, BLK_N=16, BLK_K=16).ok


def test_heap_too_small_is_a_clear_error():
    with gemmar.Cluster(world_size=2, backend="cpu", heap_size=64 << 10) as cluster:
        A, B = random_inputs(256, 256, 32, torch.float16)
        with pytest.raises(gemmar.UsageError, match="heap too small"):
            cluster.gemm_all_reduce(A, B, algorithm="atomics", BLK_M=32, BLK_N=32, BLK_K=32)


def test_engines_that_do_not_come_up_in_time_are_a_clear_error(monkeypatch):
    # (the processes this cluster starts inherit a mark of this test: another worker's clusters may be starting too)
    mark = f"engines-in-time-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("GEMMAR_TEST_MARK", mark)
    with pytest.raises(gemmar.ClusterError, match=r"engines came up within 0.01 s"):
        gemmar.Cluster(world_size=2, backend="cpu", start_timeout_s=0.01)

    def leftover():
        return [p for p in psutil.process_iter() if p.pid != os.getpid() and _environ(p).get("GEMMAR_TEST_MARK") == mark]

    assert wait_until(lambda: not leftover(), timeout_s=10), leftover()


def _environ(p):
    try:
        return p.environ()
    except (psutil.Error, OSError):
        return {}


def test_a_gemmar_error_in_a_notebook_is_its_one_line(tmp_path):
    """IPython (a notebook cell) shows an error gemmar raises on purpose as its one line, not a traceback
    through gemmar's code; any other error keeps its traceback. (A process of its own: IPython's shell is
    one per process.)"""
    import subprocess
    import sys

    script = ("from IPython.core.interactiveshell import InteractiveShell\n"
              "shell = InteractiveShell.instance()\n"
              "shell.run_cell('import gemmar\\ngemmar.Cluster(world_size=0)')\n"
              "print('-- then --')\n"
              "shell.run_cell('1 / 0')\n")
    # (IPython keeps its history under IPYTHONDIR: a test writes nothing into the user's home)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython")))
    ours, other = p.stdout.split("-- then --")
    lines = [line for line in ours.splitlines() if line.strip()]
    assert len(lines) == 1 and "UsageError" in lines[0] and "world_size" in lines[0] and "Traceback" not in ours, \
        p.stdout + p.stderr
    assert "Traceback" in other and "ZeroDivisionError" in other, p.stdout + p.stderr


def test_a_run_draws_its_progress_with_tqdm(clusters, monkeypatch, capsys):
    """Issue 61: progress is drawn by tqdm (tqdm.auto: a widget in a notebook, a line in a terminal or a log), not a
    bar of gemmar's own; a run given progress=True (a puzzle's check, gemmar bench) that lasts past PROGRESS_AFTER_S
    shows the launches checked, and the time of the one running moves on while it runs."""
    import io

    import tqdm

    from gemmar import cluster as cluster_module
    from gemmar.progress import ProgressBar

    bar = ProgressBar(3, label="steps ", stream=io.StringIO())
    assert isinstance(bar.bar, tqdm.std.tqdm)
    bar.close()
    monkeypatch.setattr(cluster_module, "PROGRESS_AFTER_S", 0.0)
    A, B = random_inputs(64, 48, 40, torch.float32, seed=3)
    result = clusters(2).gemm_all_reduce(A, B, algorithm="ring", BLK_M=16, BLK_N=16, BLK_K=16, iterations=2,
                                         progress=True)
    assert result.ok
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[gemmar] ring: launches [")]
    assert lines and "] 2/2 " in lines[-1] and lines[-1].endswith("all checked"), lines
    assert any(line.startswith("[gemmar] ring: launches [....") and "launch 1 of 2 running" in line for line in lines)
