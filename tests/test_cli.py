"""The CLI as a user runs it: real processes, real engines, exit codes and the JSON report. Refusals that
happen before any work run in this process (a subprocess each would import torch and Triton again); two
of them also run as real processes."""

import json
import os
import subprocess
import sys

import pytest

import gemmar
from inputs import gemmar_shm_entries, loose_gemmar_files

GEMMAR = [sys.executable, "-m", "gemmar.cli"]


def run(*args, timeout=300):
    return subprocess.run(GEMMAR + list(args), capture_output=True, text=True, timeout=timeout)


def in_process(capsys, *args):
    """``gemmar ARGS`` in this process: (exit code, stdout, stderr). argparse's refusals exit by SystemExit."""
    from gemmar import cli

    try:
        code = cli.main(list(args))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


@pytest.mark.parametrize("algorithm", ["ring", "atomics"])
def test_bench_validates_and_writes_json(tmp_path, algorithm):
    out = tmp_path / "run.json"
    p = run("bench", "-r", "3", "--algorithm", algorithm, "-m", "40", "-n", "36", "-k", "30", "--BLK_M", "16",
            "--BLK_N", "16", "--BLK_K", "16", "-v", "-b", "--iterations", "3", "--output_file", str(out), "-t")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    for r in range(3):
        assert any(line.startswith(f"[gemmar] [{r}/3] {algorithm} iteration 3/3") for line in lines)
        assert any(line.startswith(f"[gemmar] [{r}/3] ok: max|C - ref|") for line in lines)
    assert any("PASSED" in line for line in lines)
    report = json.loads(out.read_text())
    assert report["success"] is True and report["validated"] is True
    assert report["args"]["algorithm"] == algorithm and report["args"]["num_ranks"] == 3
    assert 0 <= report["max_abs_diff"] < 1e-2
    assert len(report["seconds_per_iteration"]) == 3
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2]
    trace = gemmar.Trace.load(tmp_path / "run.trace.json")      # -t wrote the trace beside the report
    assert trace.meta["algorithm"] == algorithm and sorted(trace.events["rank"].unique()) == [0, 1, 2]
    assert len(trace.events) == 3 * trace.expected_event_count()


@pytest.mark.parametrize("args,needle", [
    (["-m", "0"], "m=0"),
    (["-k", "-5"], "k=-5"),
    (["--BLK_M", "24"], "BLK_M=24"),
    (["--BLK_K", "512"], "BLK_K=512"),
    (["--datatype", "fp8"], "fp8"),
    (["--algorithm", "tree"], "tree"),
    (["-r", "0"], "world_size=0"),
    (["--iterations", "0"], "iterations=0"),
    (["-m", "x"], "'x'"),
    (["--backend", "cuda", "-r", "2"], "needs an NVIDIA GPU"),
    (["--num_sms", "0"], "num_sms=0"),
    (["--timeout", "-1"], "timeout_s=-1"),
    (["--heap_size", "0"], "--heap_size 0"),
    (["--output_file", "/nonexistent/out.json"], "the folder /nonexistent does not exist"),
    (["--output_file", "/tmp"], "is a folder"),
    (["--heap_size", "10"], "heap_size=10 is not allowed"),
    (["--heap_size", str(10 ** 14)], "of shared memory"),            # before any arena file is made
    (["-m", "100000", "-n", "100000"], "needs about"),               # before the engines start
    (["--seed", str(10 ** 24)], "seed=" + str(10 ** 24)),
    (["--seed", "-1"], "seed=-1"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, monkeypatch, args, needle):
    # Refused before any cluster starts: no heap folder made, nothing left in the shared-memory folder (only
    # loose files are looked at there: another worker's clusters come and go, inputs.loose_gemmar_files).
    from gemmar.runtime import engines

    before, folders = gemmar_shm_entries(), []
    for name in ("make_heap_folder", "private_folder"):
        made = getattr(engines, name)
        monkeypatch.setattr(engines, name, lambda *a, made=made, **kw: folders.append(made(*a, **kw)) or folders[-1])
    p = in_process(capsys, "bench", *args)
    assert not folders and not loose_gemmar_files(before)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert needle in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("flag", ["-o", "--perfetto", "--tile_grid"])
def test_gantt_output_paths_are_checked_before_drawing(capsys, tmp_path, flag):
    trace = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                         "cpu-ring-4ranks-48x40x40.trace.json.gz")
    target = "/nonexistent/x.png" if flag != "--perfetto" else "/nonexistent/p.json"
    p = in_process(capsys, "gantt", trace, *(["-o", str(tmp_path / "g.png")] if flag != "-o" else []), flag, target)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "/nonexistent does not exist" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "g.png").exists()      # refused before anything was drawn


def test_refusals_from_a_real_process():
    p = run(timeout=60)
    assert p.returncode == 2 and "command" in p.stderr
    p = run("bench", "--BLK_M", "24", timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "gemmar: error: BLK_M=24 is not allowed: use a power of two from 16 to 256 (16, 32, 64, 128, 256)"]


IRIS_FLAGS = ["-m", "64", "-n", "48", "-k", "64", "-d", "-v", "-t", "-b", "--datatype", "fp16", "--BLK_M", "32",
              "--BLK_N", "16", "--BLK_K", "16", "--gsize_m", "6", "--two_tiles", "True", "--num_stages", "1",
              "--num_warps", "8", "--waves_per_eu", "0", "--mfmaInstrSize", "16", "--kpack", "2",
              "--heap_size", str(1 << 28), "--gemm_sms", "3", "--total_sms", "5", "-r", "2"]


@pytest.mark.parametrize("algorithm", ["two_shot", "atomics"])
def test_iris_command_lines_run_and_their_report_reads_with_iris_keys(tmp_path, algorithm):
    # Every flag of Iris's GEMM + all-reduce benchmark.py scripts (atomics and ring) at least once.
    out = tmp_path / "log.json"
    p = run("bench", *IRIS_FLAGS, "--algorithm", algorithm, "--output_file", str(out))
    assert p.returncode == 0, p.stderr
    for name in ("two_tiles", "waves_per_eu", "mfmaInstrSize", "kpack"):
        assert f"--{name} is an AMD compiler setting of Iris's benchmark: it means nothing here" in p.stdout
    assert "-d: nothing compiled on the cpu backend" in p.stdout
    assert ("--total_sms means nothing for atomics" in p.stdout) == (algorithm == "atomics")
    report = json.loads(out.read_text())
    # Iris's keys, with Iris's meaning: k is the per-rank K, K the global one.
    assert report["world_size"] == 2 and report["gemm_sms"] == 3 and report["success"] is True
    assert (report["m"], report["n"], report["k"], report["M"], report["N"], report["K"]) == (64, 48, 32, 64, 48, 64)
    assert report["total_ms"] > 0 and report["tflops"] > 0 and report["gemm_ms"] == report["total_ms"]
    assert report["triton_ms"] == report["total_ms"] and report["gemm_experiments"] == 1
    assert report["BLK_M"] == 32 and report["gsize_m"] == 6 and report["kpack"] == "2"
    assert "gemm_registers" not in report           # nothing compiled under the interpreter
    # gemmar's own keys stay; --total_sms made two_shot's communication programs.
    assert report["config"]["num_sms"] == 3 and report["max_abs_diff"] is not None
    if algorithm == "two_shot":
        assert report["config"]["comm_sms"] == 2


def test_inconsistent_iris_program_counts_are_one_line_errors(capsys):
    p = in_process(capsys, "bench", "--algorithm", "two_shot", "--gemm_sms", "4", "--total_sms", "4")
    assert p.returncode == 2 and "leaves no communication program" in p.stderr
    p = in_process(capsys, "bench", "--algorithm", "two_shot", "--gemm_sms", "4", "--total_sms", "8", "--comm_sms", "3")
    assert p.returncode == 2 and "give two of the three" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_algorithm_auto_says_what_it_chose_and_why():
    p = run("bench", "--algorithm", "auto", "-r", "2", "-m", "48", "-n", "40", "-k", "64", "-v", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "--algorithm auto: two_shot, because there is no NCCL path between these ranks" in p.stdout
    assert "PASSED" in p.stdout


@pytest.mark.parametrize("argv", [["bench", "--bad_flag"], ["bench", "--algorithm", "rung"], ["allreduce", "--schemes", "x"],
                                  ["run"], ["bench", "--datatype", "int8"]])
def test_a_bad_flag_is_refused_before_torch_triton_or_ipyparallel_is_imported(argv):
    """Issue 61: a bad flag took 11-14 s to be refused on a loaded machine, the time torch and Triton take to
    import. The parser needs none of them: the refusal comes first, and they were never imported."""
    code = ("import sys\nfrom gemmar.console import main\ntry:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print(sorted(m for m in ('torch', 'triton', 'ipyparallel', 'numpy') if m in sys.modules), code)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[] 2", (done.stdout, done.stderr)
    assert done.stderr.startswith("gemmar") and ": error: " in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
