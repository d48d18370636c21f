"""The fused kernels against a float64 torch reference: world sizes 1-4, all dtypes, odd shapes, tile
counts below the rank count, uneven K, and back-to-back launches with no host reset in between; and
two_shot's promise that every rank holds the same bits, run after run."""

import pytest
import torch

import gemmar
from gemmar.algorithms import builtin_names
from gemmar.analysis.source import answer_source
from inputs import allowed_error, random_inputs, reference

ALGORITHMS = list(builtin_names())


def check(result, A, B, world_size):
    """Independent of the package's own check: compare rank 0's C here, and every rank's reported diff."""
    ref = reference(A, B)
    tol = allowed_error(result, A, B)
    assert result.C.shape == ref.shape
    diff = (result.C.double() - ref).abs().max().item()
    assert diff <= tol, f"max |C - ref| = {diff}"
    assert len(result.ranks) == world_size
    for r in result.ranks:
        assert len(r.max_abs_diff) == result.config.iterations
        assert max(r.max_abs_diff) <= tol
    assert result.ok


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_world_sizes_and_dtypes(clusters, world_size, algorithm, dtype):
    # 40 x 24 with 16 x 16 tiles: 3 x 2 = 6 tiles, both edges partial; K = 37 splits unevenly.
    A, B = random_inputs(40, 24, 37, dtype, seed=world_size)
    result = clusters(world_size).gemm_all_reduce(A, B, algorithm=algorithm, BLK_M=16, BLK_N=16, BLK_K=16, iterations=2,
                                                  num_sms=4)
    check(result, A, B, world_size)
    expected = dtype if algorithm in ("two_shot", "one_shot") else torch.float32   # they return the input dtype
    assert result.C.dtype == expected


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("shape,block,num_sms", [
    ((16, 16, 40), (16, 16, 16), 3),      # one tile, fewer tiles than ranks and programs
    ((33, 17, 5), (16, 16, 16), 2),       # K smaller than a block, odd M and N
    ((50, 70, 64), (32, 16, 32), 5),      # tile count (2 x 5 = 10) not a multiple of programs or ranks
    ((64, 48, 3), (16, 16, 16), 4),       # K = 3 over 4 ranks: one rank has an empty K-slice
])
def test_odd_shapes_on_four_ranks(clusters, algorithm, shape, block, num_sms):
    m, n, k = shape
    A, B = random_inputs(m, n, k, torch.float16, seed=k)
    result = clusters(4).gemm_all_reduce(A, B, algorithm=algorithm, BLK_M=block[0], BLK_N=block[1], BLK_K=block[2],
                                         iterations=2, num_sms=num_sms, gsize_m=3)
    check(result, A, B, 4)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_twenty_back_to_back_launches(clusters, algorithm):
    # Atomics alternate output buffers and zero the next one in-kernel; the ring's flags are sequence
    # numbers. Either mistake (no zeroing, a stale flag) shows as a wrong sum from the second launch on.
    A, B = random_inputs(48, 40, 36, torch.float16, seed=20)
    result = clusters(3).gemm_all_reduce(A, B, algorithm=algorithm, BLK_M=16, BLK_N=16, BLK_K=16, iterations=20, num_sms=3)
    check(result, A, B, 3)
    assert all(len(r.max_abs_diff) == 20 for r in result.ranks)


def test_seeded_bench_checks_every_rank(clusters):
    config = gemmar.RunConfig(m=40, n=40, k=40, algorithm="ring", BLK_M=16, BLK_N=16, BLK_K=16, iterations=3)
    result = clusters(2).bench(config)
    assert result.ok and len(result.seconds) == 3
    assert all(len(r.max_abs_diff) == 3 for r in result.ranks)


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("out_dtype,wire_dtype", [(None, None), ("fp32", None), ("fp32", "fp32")])
def test_two_shot_and_one_shot_give_every_rank_the_same_bits_run_after_run(clusters, world_size, out_dtype,
                                                                           wire_dtype):
    # One owner (one_shot: every rank) sums each tile in rank order, so C is bit-identical on every rank, a
    # second run of the same inputs gives the same bits again, and both kernels give the same bits.
    A, B = random_inputs(48, 40, 61, torch.bfloat16, seed=world_size)
    cluster = clusters(world_size)
    outputs = []
    for algorithm in ("two_shot", "one_shot"):
        runs = [cluster.gemm_all_reduce(A, B, algorithm=algorithm, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3,
                                        comm_sms=2, iterations=2, out_dtype=out_dtype, wire_dtype=wire_dtype)
                for _ in range(2)]
        for result in runs:
            check(result, A, B, world_size)
            for r in result.ranks:
                assert torch.equal(r.C, result.ranks[0].C), f"{algorithm}: rank {r.rank}'s C differs from rank 0's"
        assert torch.equal(runs[0].C, runs[1].C)
        assert runs[0].C.dtype == (torch.float32 if out_dtype == "fp32" else torch.bfloat16)
        outputs.append(runs[0].C)
    assert torch.equal(*outputs), "two_shot and one_shot sum in the same order, so their bits must agree"


def test_two_shot_with_fp32_on_the_wire_is_as_precise_as_the_ring(clusters):
    A, B = random_inputs(40, 40, 64, torch.float16, seed=5)
    result = clusters(3).gemm_all_reduce(A, B, algorithm="two_shot", BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2,
                                         out_dtype="fp32", wire_dtype="fp32")
    assert (result.C.double() - reference(A, B)).abs().max() < 1e-4


@pytest.mark.parametrize("comm_sms", [1, 2, 5])
def test_two_shot_any_number_of_communication_programs(clusters, comm_sms):
    # 3 x 3 = 9 tiles over 4 ranks: rank 0 owns 3 tiles, the others 2; more programs than owned tiles too.
    A, B = random_inputs(48, 48, 50, torch.float16, seed=comm_sms)
    result = clusters(4).gemm_all_reduce(A, B, algorithm="two_shot", BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2,
                                         comm_sms=comm_sms, iterations=2)
    check(result, A, B, 4)


def _module_from(path, source):
    import importlib.util

    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("out_dtype,wire_dtype", [(None, None), ("fp32", None), ("fp32", "fp32"), (None, "fp32")])
def test_two_shot_at_one_rank_gemm_programs_write_the_bits_the_reduction_would(clusters, out_dtype, wire_dtype,
                                                                               tmp_path):
    # At world size 1 the GEMM programs write each tile straight into C (two_shot.write_alone_tile); with a
    # sum_partials given as a part (here a copy of the package's own, as a participant's: it travels as source) the
    # communication programs sum every tile (as many as the GEMM's, so no GEMM program helps). The same bits
    # either way, and the trace shows who wrote C: GEMM programs (0 .. 2) or communication programs (3 .. 5).
    A, B = random_inputs(40, 56, 45, torch.bfloat16, seed=11)
    cluster = clusters(1)
    settings = dict(algorithm="two_shot", BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3, comm_sms=3, iterations=3,
                    out_dtype=out_dtype, wire_dtype=wire_dtype, trace=True)
    direct = cluster.gemm_all_reduce(A, B, **settings)
    # (the package's own function object itself would travel as an import and be the kernel's own part again;
    # its text is kept out of sight, kernels/puzzle_parts.py, so the copy is written to a file of its own)
    copy = _module_from(tmp_path / "copy_of_sum_partials.py", "import triton\nimport triton.language as tl\n"
                        "from gemmar.kernels import device\n\n\n" + answer_source("sum_partials")).sum_partials
    through = cluster.gemm_all_reduce(A, B, parts={"sum_partials": copy}, **settings)
    for result, writers in ((direct, "GEMM"), (through, "communication")):
        check(result, A, B, 1)
        for iteration in range(3):
            events = result.trace.iteration(iteration)
            written = events[events.kind == "broadcast"]
            assert sorted(written.tile) == list(range(3 * 4)), f"iteration {iteration}: tiles written {written.tile}"
            by_gemm = written.program < 3
            assert by_gemm.all() if writers == "GEMM" else not by_gemm.any(), written.program.tolist()
    assert torch.equal(direct.C, through.C)
    # The few-rows kernel (as split-K) runs the package's own sum only: a participant's is refused in one line.
    with pytest.raises(gemmar.UsageError, match="gemv=True runs the package's own sum"):
        cluster.gemm_all_reduce(A, B, parts={"sum_partials": copy}, algorithm="two_shot", BLK_M=64, BLK_N=16,
                                BLK_K=16, gemv=True)


@pytest.mark.parametrize("algorithm", ["two_shot", "one_shot"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,block,split_k,num_sms", [
    ((40, 24, 200), (16, 16, 16), 3, 5),   # 13 K steps cut 4 + 4 + 5; 6 tiles on 5 programs: 5 whole, 1 x 3 slices
    ((72, 40, 100), (16, 16, 16), 2, 4),   # 15 tiles on 4 programs: 12 whole, the last wave's 3 x 2 slices
    ((128, 32, 96), (64, 16, 16), 2, 3),   # 64-row tiles, summed 32 rows at a time (SPLIT_SUM_ROWS); 3 whole, 1 cut
    ((48, 48, 112), (16, 16, 16), 3, 4),   # 9 tiles: 8 whole, the last one's 7 steps over 3 programs (2 + 2 + 3)
    ((48, 16, 48), (16, 16, 16), 2, 5),    # 3 tiles x 2 > 5 programs: 9 steps in shares of 1-2 that cross tiles (stream-K)
    ((16, 40, 37), (16, 16, 16), 3, 4),    # one step a slice, the last one past K's edge (masked)
    ((5, 33, 130), (16, 32, 32), 4, 7),    # a few rows (5 of a 16-row tile), N and K both uneven
])
def test_split_k_at_one_rank(clusters, algorithm, dtype, shape, block, split_k, num_sms):
    # The last wave's tiles' K cut into slices, summed by whichever program counts in last, the tiles before it
    # whole (two_shot.one_rank_split_gemm): right for every dtype and edge, the count back at 0 after every
    # launch (3 back to back), every tile written once a launch (the trace), and the same bits every run (the
    # slices summed in slice order, whoever is last).
    m, n, k = shape
    A, B = random_inputs(m, n, k, dtype, seed=k)
    settings = dict(algorithm=algorithm, BLK_M=block[0], BLK_N=block[1], BLK_K=block[2], split_k=split_k,
                    num_sms=num_sms, iterations=3, trace=True)
    first = clusters(1).gemm_all_reduce(A, B, **settings)
    check(first, A, B, 1)
    tiles = -(-m // block[0]) * -(-n // block[1])
    config = gemmar.RunConfig(algorithm=algorithm, world_size=1, m=m, n=n, k=k, BLK_M=block[0], BLK_N=block[1],
                       BLK_K=block[2], num_sms=num_sms, split_k=split_k).validate()
    whole, (sharing, parts) = config.whole_tiles, config.k_shares
    assert whole == num_sms * ((tiles - 1) // num_sms) and sharing == min(num_sms, (tiles - whole) * split_k)
    for iteration in range(3):
        events = first.trace.iteration(iteration)
        assert sorted(events[events.kind == "broadcast"].tile) == list(range(tiles))
        # a whole tile one GEMM (step 0); a cut tile one a program whose share touches it, numbered from 0
        touching = [sum(cut in touched for touched in parts) for cut in range(tiles - whole)]
        steps = events[events.kind == "gemm"].groupby("tile").step.apply(sorted)
        assert list(steps.index) == list(range(tiles))
        assert all(steps[t] == ([0] if t < whole else list(range(touching[t - whole]))) for t in range(tiles))
        assert len(events) == first.trace.expected_event_count()
    # The replay's GEMM of a tile runs from its first slice's start to its last slice's end.
    from gemmar.analysis.replay import _Timeline

    timeline, gemms = _Timeline(first.trace, -1), events[events.kind == "gemm"].groupby("tile")
    assert list(timeline.gemm_start[0]) == list(gemms.start_us.min()) and \
        list(timeline.gemm_end[0]) == list(gemms.end_us.max())
    again = clusters(1).gemm_all_reduce(A, B, **{**settings, "trace": False, "iterations": 1})
    assert torch.equal(first.C, again.C)


@pytest.mark.parametrize("algorithm", ["two_shot", "one_shot"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,block,split_k", [
    ((1, 70, 200), (16, 32, 32), 3),    # one row: the multiply-add path; 3 column tiles (the last 6 wide) x 3 slices
    ((1, 64, 37), (16, 32, 16), 1),     # one row, one slice: each program writes its tile; K past the edge (masked)
    ((5, 33, 130), (16, 32, 32), 4),    # a few rows of a 16-row dot, N and K both uneven, 5 steps in 4 slices
    ((16, 48, 96), (16, 16, 32), 2),    # all 16 rows
    ((40, 24, 64), (64, 16, 16), 4),    # 40 rows in a 64-row tile, one step a slice
])
def test_gemv_at_one_rank(clusters, algorithm, dtype, shape, block, split_k):
    # The few-rows kernel (two_shot.one_rank_gemv): one program per column tile and K slice; right for every dtype and
    # edge, the counts back at 0 after every launch (3 back to back), every tile written once a launch (the trace),
    # each program one GEMM event, and the same bits every run (the slices summed in slice order).
    m, n, k = shape
    A, B = random_inputs(m, n, k, dtype, seed=k + m)
    settings = dict(algorithm=algorithm, BLK_M=block[0], BLK_N=block[1], BLK_K=block[2], split_k=split_k, gemv=True,
                    iterations=3, trace=True)
    first = clusters(1).gemm_all_reduce(A, B, **settings)
    check(first, A, B, 1)
    tiles = -(-n // block[1])
    config = gemmar.RunConfig(world_size=1, m=m, n=n, k=k, **{**settings, "trace": False}).validate()
    assert config.num_sms == tiles * split_k and config.work_units == tiles * split_k
    for iteration in range(3):
        events = first.trace.iteration(iteration)
        assert sorted(events[events.kind == "broadcast"].tile) == list(range(tiles))
        gemms = events[events.kind == "gemm"]
        assert sorted(gemms.program) == list(range(tiles * split_k))
        assert all(sorted(steps) == list(range(split_k)) for steps in gemms.groupby("tile").step.apply(list))
        assert len(events) == first.trace.expected_event_count()
    again = clusters(1).gemm_all_reduce(A, B, **{**settings, "trace": False, "iterations": 1})
    assert torch.equal(first.C, again.C)


def test_gemv_is_refused_where_it_cannot_run():
    for settings, needle in ((dict(world_size=2, algorithm="two_shot"), "two_shot at world size 2"),
                             (dict(world_size=1, algorithm="ring"), "ring at world size 1"),
                             (dict(world_size=1, algorithm="two_shot", m=40, BLK_M=32), "BLK_M=32 is less than m=40"),
                             (dict(world_size=1, algorithm="two_shot", gemv="yes"), "gemv='yes' is not allowed"),
                             (dict(world_size=1, algorithm="two_shot", m=1, n=1 << 20, BLK_N=16, k=4096, split_k=2),
                              "makes 131072 programs: use at most 65536")):
        with pytest.raises(gemmar.UsageError, match=needle):
            gemmar.RunConfig(**{"m": 16, "BLK_M": 16, "gemv": True, **settings}).validate()
