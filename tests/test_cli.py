"""The CLI as a user runs it: real processes, real engines, exit codes and the JSON report."""

import json
import subprocess
import sys

import pytest

import gemmar

GEMMAR = [sys.executable, "-m", "gemmar.cli"]


def run(*args, timeout=300):
    return subprocess.run(GEMMAR + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("algorithm", ["ring", "atomics"])
def test_bench_validates_and_writes_json(tmp_path, algorithm):
    out = tmp_path / "run.json"
    p = run("bench", "-r", "3", "--algorithm", algorithm, "-m", "40", "-n", "36", "-k", "30", "--BLK_M", "16",
            "--BLK_N", "16", "--BLK_K", "16", "-v", "-b", "--iterations", "3", "--output_file", str(out), "-t")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    for r in range(3):
        assert any(l.startswith(f"[gemmar] [{r}/3] {algorithm} iteration 3/3") for l in lines)
        assert any(l.startswith(f"[gemmar] [{r}/3] ok: max|C - ref|") for l in lines)
    assert any("PASSED" in l for l in lines)
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
])
def test_bad_arguments_exit_2_with_one_line(args, needle):
    p = run("bench", *args, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert needle in p.stderr
    assert "Traceback" not in p.stderr


def test_no_command_exits_2():
    p = run(timeout=60)
    assert p.returncode == 2 and "command" in p.stderr
