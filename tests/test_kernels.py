"""Both fused kernels against a float64 torch reference: world sizes 1-4, all dtypes, odd shapes, tile
counts below the rank count, uneven K, and back-to-back launches with no host reset in between."""

import pytest
import torch

import gemmar
from inputs import random_inputs, reference

ALGORITHMS = ["atomics", "ring"]


def check(result, A, B, world_size):
    """Independent of the package's own check: compare rank 0's C here, and every rank's reported diff."""
    ref = reference(A, B)
    tol = 1e-3 * max(1.0, A.shape[1] ** 0.5)
    assert result.C.shape == ref.shape
    diff = (result.C.double() - ref).abs().max().item()
    assert diff <= tol, f"max |C - ref| = {diff}"
    assert len(result.ranks) == world_size
    for r in result.ranks:
        assert len(r["max_abs_diff"]) == result.config.iterations
        assert max(r["max_abs_diff"]) <= tol
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
    result = clusters(4).gemm_all_reduce(A, B, algorithm=algorithm, block=block, iterations=2, num_sms=num_sms,
                                         gsize_m=3)
    check(result, A, B, 4)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_twenty_back_to_back_launches(clusters, algorithm):
    # Atomics alternate output buffers and zero the next one in-kernel; the ring's flags are sequence
    # numbers. Either mistake (no zeroing, a stale flag) shows as a wrong sum from the second launch on.
    A, B = random_inputs(48, 40, 36, torch.float16, seed=20)
    result = clusters(3).gemm_all_reduce(A, B, algorithm=algorithm, BLK_M=16, BLK_N=16, BLK_K=16, iterations=20, num_sms=3)
    check(result, A, B, 3)
    assert all(len(r["max_abs_diff"]) == 20 for r in result.ranks)


def test_seeded_bench_checks_every_rank(clusters):
    config = gemmar.RunConfig(m=40, n=40, k=40, algorithm="ring", BLK_M=16, BLK_N=16, BLK_K=16, iterations=3)
    result = clusters(2).bench(config)
    assert result.ok and len(result.seconds) == 3
    assert all(len(r["max_abs_diff"]) == 3 for r in result.ranks)
