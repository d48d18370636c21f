"""The standalone all-reduce on the symmetric heap (two_shot's pieces; two-shot and one-shot): every rank
gets the float64 sum of every rank's values within one ulp of the dtype, with the same bits on every rank,
launch after launch."""

import subprocess
import sys

import pytest

import gemmar


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("scheme", ["two_shot", "one_shot"])
def test_every_rank_gets_the_sum_with_the_same_bits(clusters, world_size, scheme):
    cluster = clusters(world_size)
    # One value, a partial tile, several whole tiles plus a tail; three dtypes; more programs than tiles.
    for numel, datatype, comm_sms in ((1, "fp32", 3), (1000, "bf16", 2), (16 * 64 * 5 + 7, "fp16", 4),
                                      (3000, "fp32", 1)):
        f = cluster.all_reduce(numel, datatype, comm_sms=comm_sms, iterations=3, seed=world_size, scheme=scheme)
        assert f["identical"], f
        assert f["max_abs_diff"] <= f["tolerance"], f
        assert f["ok"]


@pytest.mark.parametrize("world_size", [1, 3])
def test_values_already_on_the_heap_are_reduced_where_they_lie(clusters, world_size):
    """``on_heap``: each rank's values are written into the all-reduce's heap ``input`` and launched as
    ``op(op.input)`` with no copy in (how the benchmark meets torch's symmetric-memory all-reduce, which
    reduces its own buffer): same sums, same bits on every rank, launch after launch, both schemes."""
    cluster = clusters(world_size)
    for scheme in ("two_shot", "one_shot"):
        for numel, datatype in ((1, "fp32"), (16 * 64 * 3 + 5, "bf16")):
            f = cluster.all_reduce(numel, datatype, comm_sms=2, iterations=4, seed=7, scheme=scheme, on_heap=True)
            assert f["on_heap"] and f["ok"] and f["identical"], f
            assert f["max_abs_diff"] <= f["tolerance"], f


@pytest.mark.slow   # (out of the fast tier: README, "Run the tests")
@pytest.mark.parametrize("scheme", ["two_shot", "one_shot"])
def test_200_back_to_back_launches_at_world_size_3(clusters, scheme):
    """(Each launch's values scaled by another power of two: a stale or skipped launch fails.) One whole tile
    and a partial one, on two programs each with a tile."""
    f = clusters(3).all_reduce(16 * 64 + 100, "bf16", comm_sms=2, iterations=200, seed=3, scheme=scheme)
    assert f["ok"] and f["identical"] and f["checked_launches"] == 200, f


@pytest.mark.parametrize("world_size", [3])
@pytest.mark.parametrize("scheme", ["two_shot", "one_shot"])
def test_large_buffers_copied_in_by_torch_give_the_same_sums(clusters, world_size, scheme):
    """Buffers of COPY_IN_KERNEL_BELOW_BYTES and more are copied into the heap by torch before the launch;
    that path, forced here for small buffers (the interpreter is too slow for 8 MiB), launch after launch."""
    cluster = clusters(world_size)
    view = cluster.client[cluster.engine_ids]
    view.execute("import gemmar.runtime.allreduce as a; a._saved, a.COPY_IN_KERNEL_BELOW_BYTES = "
                 "a.COPY_IN_KERNEL_BELOW_BYTES, 0", block=True)
    try:
        f = cluster.all_reduce(16 * 64 * 3 + 5, "bf16", comm_sms=2, iterations=4, seed=11, scheme=scheme)
        assert f["ok"] and f["identical"], f
    finally:
        view.execute("a.COPY_IN_KERNEL_BELOW_BYTES = a._saved", block=True)


def test_bad_all_reduce_arguments(clusters):
    cluster = clusters(2)
    with pytest.raises(gemmar.UsageError, match="numel=0"):
        cluster.all_reduce(0)
    with pytest.raises(gemmar.UsageError, match="fp8"):
        cluster.all_reduce(10, "fp8")
    with pytest.raises(gemmar.UsageError, match="comm_sms=0"):
        cluster.all_reduce(10, comm_sms=0)
    with pytest.raises(gemmar.UsageError, match="scheme 'three_shot'"):
        cluster.all_reduce(10, scheme="three_shot")


def test_auto_takes_one_shot_only_for_small_buffers_with_a_gpu_per_rank(clusters):
    from gemmar.runtime.allreduce import ONE_SHOT_BELOW_BYTES, default_scheme

    small, large = ONE_SHOT_BELOW_BYTES - 2, ONE_SHOT_BELOW_BYTES
    assert default_scheme(small, "cuda", 2, 1) == "one_shot"
    assert default_scheme(large, "cuda", 2, 1) == "two_shot"
    assert default_scheme(small, "cuda", 1, 1) == "two_shot"   # one rank: the same work either way
    assert default_scheme(small, "cuda", 2, 2) == "two_shot"   # ranks sharing a GPU: measured with two_shot only
    assert default_scheme(small, "cpu", 4, 1) == "two_shot"
    cluster = clusters(2)
    f = cluster.all_reduce(1000, "bf16", comm_sms=2, iterations=2)   # the default: auto
    assert f["ok"] and f["identical"], f
    assert f["scheme"] == "two_shot" or cluster.backend != "cpu"   # (GPUs, one a rank: one_shot)


def test_the_allreduce_command(tmp_path):
    p = subprocess.run([sys.executable, "-m", "gemmar.cli", "allreduce", "-r", "2", "--sizes", "0.01", "0.02",
                        "--datatype", "fp16", "--schemes", "two_shot", "one_shot", "auto",
                        "--output_file", str(tmp_path / "ar.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if "MiB fp16 x 2 ranks" in line]
    assert len(lines) == 6 and all("PASSED" in line and "same bits on every rank: yes" in line for line in lines)
    assert sum("two_shot (auto)" in line for line in lines) == 2   # (cpu: two_shot)
    assert (tmp_path / "ar.json").exists()
    # A progress bar on stderr (issue 52: no surprise waits), ending at every launch of every size and scheme.
    bars = [line for line in p.stderr.splitlines() if line.startswith("[gemmar] checked launches [")]
    assert bars and "] 18/18 " in bars[-1] and "0.02 MiB, auto" in bars[-1], p.stderr[-2000:]
