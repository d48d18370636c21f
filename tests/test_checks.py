"""Every value the client can check is checked before any engine starts: one line, exit 2, nothing started.
These run the CLI in this process (a subprocess each would import torch and Triton again)."""

import os

import pytest
import torch

import gemmar
from gemmar import cli, outputs

STARTED = "starting"   # the line the CLI prints just before the engines start


def refused(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("gemmar: error: "), err
    assert STARTED not in out, out
    return err


@pytest.mark.parametrize("argv,needle", [
    (["bench", "--output_file", "/dev/full"], "--output_file /dev/full is not a regular file"),
    (["bench", "--output_file", "/proc/gemmar-report.json"], "--output_file /proc/gemmar-report.json cannot be written"),
    (["bench", "--heap_size", "600"], "--heap_size 600 is too small: this run needs"),
    (["bench", "--BLK_N", "512"], "BLK_N=512 is not allowed: use a power of two from 16 to 256 (16, 32, 64, 128, 256)"),
    (["bench", "--timeout", "0.001"], "timeout_s=0.001 is not allowed: use seconds from 1 to 86400"),
    (["bench", "--iterations", "0"], "iterations=0 is out of range"),
    (["allreduce", "--sizes", "nan"], "--sizes nan: use message sizes from"),
    (["allreduce", "--sizes", "inf"], "--sizes inf: use message sizes from"),
    (["allreduce", "-r", "1", "--sizes", "9000"], "needs about"),
    (["allreduce", "--comm_sms", "0"], "comm_sms=0 is out of range"),
    (["allreduce", "--iterations", "0"], "iterations=0 is not allowed"),
])
def test_refused_before_any_engine_starts(capsys, argv, needle):
    assert needle in refused(capsys, *argv)


def test_a_fifo_where_the_trace_would_go_is_refused_before_the_work(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "gemmar.trace.json")   # -t with no --output_file writes gemmar.trace.json here
    assert "gemmar.trace.json is not a regular file" in refused(capsys, "bench", "-t")


def test_a_new_output_file_is_test_written_and_removed(capsys, tmp_path):
    path = tmp_path / "report.json"
    outputs.check_output_path("--output_file", str(path))
    assert not path.exists()


def test_api_settings_that_would_be_ignored_or_misread_are_refused():
    A, B = torch.ones(32, 16), torch.ones(16, 32)
    cluster = gemmar.Cluster(world_size=1, start=False)   # refused before it would start
    with pytest.raises(gemmar.UsageError, match=r"m=32: gemm_all_reduce takes these from A, B and the cluster"):
        cluster.gemm_all_reduce(A, B, m=32)
    with pytest.raises(gemmar.UsageError, match=r"trace='no' is not allowed: use True or False"):
        gemmar.RunConfig(trace="no").validate()
    assert not cluster.running
