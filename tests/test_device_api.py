"""Every device-API operation, across real ranks (separate engine processes over shared memory)."""

import numpy as np
import pytest

from rank_helpers import BLOCK, device_api_roundtrip


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("sem", ["relaxed", "acquire", "release", "acq_rel"])
def test_every_operation_lands_on_the_right_rank(clusters, world_size, sem):
    valid = 11  # a mask that leaves the last 5 of 16 lanes untouched
    outs = clusters(world_size).run_ranks(device_api_roundtrip, sem, valid)
    W = world_size
    lanes = np.arange(BLOCK)
    on = lanes < valid
    for r, out in enumerate(outs):
        nxt, prev = (r + 1) % W, (r - 1) % W
        # Offsets are the same on every rank: that is what makes the heap symmetric.
        assert out["offsets"] == outs[0]["offsets"]
        np.testing.assert_array_equal(out["loaded"], np.where(on, lanes + 100 * nxt, 0))
        np.testing.assert_array_equal(out["got"], np.where(on, lanes + 100 * nxt, 0))
        np.testing.assert_array_equal(out["stored"], np.where(on, lanes + 100 * prev, 0))
        np.testing.assert_array_equal(out["put_into"], np.where(on, lanes + 100 * prev, 0))
        np.testing.assert_array_equal(out["counter"], np.where(on, W, 0))
        np.testing.assert_array_equal(out["subtracted"], np.where(on, 1000 - W * (W + 1) // 2, 1000))
        np.testing.assert_array_equal(out["maxed"], np.where(on, W - 1, -1))
        np.testing.assert_array_equal(out["minned"], np.where(on, 0, 1000))
        np.testing.assert_array_equal(out["swapped"], np.where(on, prev + 1, 0))
        np.testing.assert_array_equal(out["swapped_old"], np.where(on, 0, -7))
    # Exactly one rank won rank 0's compare-and-swap, and the cell holds the winner's value.
    olds = [int(out["cas_old"][0]) for out in outs]
    assert olds.count(0) == 1
    winner = olds.index(0)
    assert int(outs[0]["cas_cell"][0]) == winner + 1
    assert sorted(o for o in olds if o) == [winner + 1] * (W - 1)
