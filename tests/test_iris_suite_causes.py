"""Each cause found by running Iris's own test suite on gemmar's ranks (benchmarks/iris_tests.py), reproduced by a
program of gemmar's own (tests/iris_programs/), without Iris's files:

- ``iris.get``'s rank roles (Iris's tests pull from ``to_rank``), with ``other=`` (it crashed ranks by SIGSEGV);
- a kernel's ``to_rank`` outside the world: one line naming the rank asked for and the world size, not SIGSEGV;
- atomics on cpu ranks: fp16 adds lost between processes, bf16 and fp32-exchange refused by the interpreter;
  bf16 arithmetic done on the bits;
- the tile API (Tile, TileView, make_tensor_view, ctx.all_reduce_* ...) against torch at an odd shape;
- Iris's allocator options and refusals, and a CUDA graph captured and replayed on cpu ranks;
- a rank that ends with exit code 1 (pytest after a failed test) no longer stops the others after 5 s;
- the sanitizer's blind spot: kernels on two streams (Iris's example 15) are concurrent to it, as on a GPU.
"""

import io
import os
import re

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "iris_programs")


def run(cluster, program, *args, timeout=300):
    out, err = io.StringIO(), io.StringIO()
    result = cluster.run_script(os.path.join(PROGRAMS, program), *args, timeout=timeout, out=out, err=err)
    lines = {r: [line.split("] ", 1)[1] for line in out.getvalue().splitlines()
                 if line.startswith(f"[rank {r}/{cluster.world_size}] ")] for r in range(cluster.world_size)}
    return result, lines, err.getvalue()


@pytest.mark.parametrize("world_size", [2, 3])
def test_get_put_copy_read_and_write_the_ranks_iris_names(clusters, world_size):
    result, lines, err = run(clusters(world_size), "rank_roles.py")
    assert result.ok, (result, err)
    for r in range(world_size):
        peer, before = (r + 1) % world_size, (r - 1) % world_size
        for dtype in ("int8", "float16", "bfloat16", "float32"):
            assert f"get torch.{dtype}: {10 * (peer + 1)} from rank {peer}'s {10 * (peer + 1)}, masked lane 0" \
                in lines[r], lines[r]
            assert f"put torch.{dtype}: {10 * (before + 1)} from rank {before}'s {10 * (before + 1)}" in lines[r]
            assert f"copy torch.{dtype}: {10 * (peer + 1)} from rank {peer}'s {10 * (peer + 1)}" in lines[r]
            assert f"ctx.get torch.{dtype}: {10 * (peer + 1)} from rank {peer}'s {10 * (peer + 1)}" in lines[r]


@pytest.mark.parametrize("world_size", [2])
@pytest.mark.parametrize("bad_rank", [5, -1])
def test_a_rank_outside_the_world_is_one_line_not_a_crash(clusters, world_size, bad_rank):
    cluster = clusters(world_size)
    result, _, _ = run(cluster, "rank_roles.py", "--bad_rank", str(bad_rank))
    assert result.exit_codes == [1, 1], result
    for r, line in enumerate(result.failure_lines()):
        assert re.fullmatch(rf"rank {r}: HeapBoundsError: rank {r}, program 0 asked for rank {bad_rank} at "
                            rf"rank_roles\.py:\d+: ranks are 0 to 1 \(world_size=2\)", line), line
    assert run(cluster, "rank_roles.py")[0].ok   # the same ranks still work: nothing died


@pytest.mark.parametrize("world_size", [2, 3])
def test_atomics_of_every_width_are_atomic_across_cpu_ranks(clusters, world_size):
    result, lines, err = run(clusters(world_size), "cpu_atomics.py")
    assert result.ok, (result, err)
    total = 2 * 25 * world_size
    assert f"torch.float16 counters: [{float(total)}] (expected [{total}.0]; bf16 counts exactly to 256)" in lines[0]
    assert f"torch.float32 counters: [{float(total)}] (expected [{total}.0]; bf16 counts exactly to 256)" in lines[0]
    # bf16 has 8 significant bits: 256 + 1 rounds back to 256, as on a GPU
    assert f"torch.bfloat16 counters: [{float(min(total, 256))}]" in " ".join(lines[0])
    assert all("bf16 3 x 1.5 x 2 - 1.5 = [7.5, 7.5, 7.5, 7.5]" in lines[r] for r in range(world_size))
    olds = [float(re.search(r"xchg old value ([\d.]+)", " ".join(lines[r])).group(1)) for r in range(world_size)]
    final = float(re.search(r"final value ([\d.]+)", " ".join(lines[0])).group(1))
    assert sorted(olds + [final]) == [float(v) for v in range(world_size + 1)]   # a chain of exchanges, none lost


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_tile_collectives_match_torch(clusters, world_size):
    result, lines, err = run(clusters(world_size), "tile_collectives.py", "-m", "100", "-n", "72", timeout=600)
    assert result.ok, (result, err)
    for r in range(world_size):
        checks = [line for line in lines[r] if "max|diff|" in line]
        assert len(checks) == 3 * 9, lines[r]
        for line in checks:   # inputs are multiples of 1/4 below 2: sums are exact in every dtype
            assert line.endswith("max|diff| = 0"), line


@pytest.mark.parametrize("world_size", [2])
def test_irises_allocator_options_refusals_and_a_replayed_graph(clusters, world_size):
    result, lines, err = run(clusters(world_size), "host_api.py")
    assert result.ok, (result, err)
    for r in range(world_size):
        peer = (r + 1) % world_size
        said = "\n".join(lines[r])
        assert "out= shares memory: True (2, 3)" in said
        assert "nested shape: (2, 3, 4) scalar: ()" in said
        assert "zero-size on the heap: True True" in said
        assert "randint dtype: torch.int64 linspace (5,): (5,)" in said
        assert "requires_grad: True" in said and "generator repeats: True" in said
        assert "channels_last kept: True True" in said
        refusals = [line for line in lines[r] if line.startswith("refused:")]
        assert refusals[0] == "refused: IrisRefusal: The output tensor has 4 elements, but 3 are required"
        assert refusals[1] == ("refused: IrisRefusal: The output tensor has dtype torch.int32, but torch.float32 "
                               "is required")
        assert refusals[2].startswith("refused: IrisRefusal: The output tensor is not on the symmetric heap")
        assert refusals[3].startswith("refused: UsageError: layout=torch.sparse_coo")
        assert refusals[4].startswith("refused: IrisRefusal: device='mps'")
        assert refusals[5].startswith("refused: UsageError: arange(5, 1, step=1)")
        assert "capture ran nothing: True" in said
        for i in range(3):
            assert f"replay {i}: read {peer + 10 * i} (rank {peer} wrote {peer + 10 * i})" in said


ENDS_EARLY = """
import sys, time
import iris
shmem = iris.iris(1 << 20)
if shmem.get_rank() == 0:
    sys.exit(1)           # pytest's way of saying a test failed
time.sleep(7)
print("finished its own work")
"""


@pytest.mark.parametrize("world_size", [2])
def test_a_rank_that_exits_with_a_code_lets_the_others_finish(clusters, world_size, tmp_path):
    program = tmp_path / "ends_early.py"
    program.write_text(ENDS_EARLY)
    out, err = io.StringIO(), io.StringIO()
    result = clusters(world_size).run_script(str(program), timeout=60, out=out, err=err)
    assert result.exit_codes == [1, 0], result
    assert "[rank 1/2] finished its own work" in out.getvalue()


ENDS_WITH_AN_ENUM = """
import sys
from outcomes import Outcome   # (a module beside the program: it goes with the program's run, as pytest did there)
sys.exit(Outcome.TESTS_FAILED)
"""


@pytest.mark.parametrize("world_size", [2])
def test_an_exit_code_given_as_an_int_enum_comes_back_as_its_number(clusters, world_size, tmp_path):
    # (Iris's launcher exits with pytest.main's ExitCode; on a GPU box every rank's result came back as
    # "PicklingError: Can't pickle <enum 'ExitCode'>" instead of exit code 1)
    program = tmp_path / "ends_with_an_enum.py"
    program.write_text(ENDS_WITH_AN_ENUM)
    (tmp_path / "outcomes.py").write_text("import enum\nclass Outcome(enum.IntEnum):\n    TESTS_FAILED = 1\n")
    result = clusters(world_size).run_script(str(program), timeout=60, out=io.StringIO(), err=io.StringIO())
    assert result.exit_codes == [1, 1] and result.errors == ["exit code 1"] * 2, result


@pytest.mark.parametrize("world_size", [2])
def test_the_sanitizer_sees_two_streams_as_a_gpu_runs_them(clusters, world_size):
    """Example 15's plain-store flag between a GEMM kernel and a communication kernel on two streams: a race the
    cpu backend hid (its streams did nothing, so both kernels looked ordered). Ordered by the host (wait_stream,
    an event, synchronize, one stream) or by a release flag, no race."""
    cluster = clusters(world_size)

    def races(*args):
        out, err = io.StringIO(), io.StringIO()
        result = cluster.run_script(os.path.join(PROGRAMS, "two_streams.py"), *args, timeout=120, out=out, err=err,
                                    sanitize=True)
        assert result.ok and out.getvalue().count("64 of 64 values arrived") == world_size, (result, err.getvalue())
        return [race.text for race in result.sanitizer.races]

    found = races("--flag", "plain", "--order", "none")
    assert any(t.startswith("race on locks[") and "writes this flag with a plain store" in t for t in found), found
    assert any(t.startswith("race on tiles[") and "(consume) reads it" in t for t in found), found
    for order in ("wait_stream", "event", "synchronize", "one_stream"):
        assert races("--flag", "plain", "--order", order) == [], order
    assert races("--flag", "release", "--order", "none") == []
