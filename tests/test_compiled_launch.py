"""PreparedLaunch under the interpreter (in a subprocess: the interpreter is chosen when Triton is imported):
``at`` sets the per-launch arguments from the launch count and any argument given anew; ``replay`` launches
again with every argument as it was, and is refused for a kernel whose arguments change every launch. A fused
launch at one rank is replayed (a CUDA graph on a GPU), one with a part of its own launched with ``at``."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl

    from gemmar.runtime.compiled_launch import PreparedLaunch


    @triton.jit(do_not_specialize=["epoch"])
    def add_epoch(x, epoch, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(x + offsets, tl.load(x + offsets) + epoch + 1)


    x, y = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    counted = PreparedLaunch(add_epoch, (1,), (x, 0), {"BLOCK": 4}, per_launch=("epoch",))
    counted.at(0)
    counted.at(5)                  # epoch 5: adds 6
    counted.at(1, x=y)             # another tensor: y gets 2
    print("counted", x.tolist(), y.tolist())
    try:
        counted.replay()
    except ValueError as e:
        print("refused:", e)
    fixed = PreparedLaunch(add_epoch, (1,), (x, 2), {"BLOCK": 4})
    fixed.at(0)
    fixed.replay()
    fixed.replay()                 # each launch adds 3, as the first did
    print("replayed", x.tolist())
    z = torch.zeros(4, dtype=torch.int32)
    fresh = PreparedLaunch(add_epoch, (1,), (z, 4), {"BLOCK": 4})
    fresh.replay()                 # a replay before any launch launches first (as a one-rank launch does)
    fresh.replay()
    print("replayed first", z.tolist())
''')


def test_at_and_replay_launch_what_they_say():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0] == "counted [7, 7, 7, 7] [2, 2, 2, 2]"
    assert lines[1] == ("refused: add_epoch: its per-launch arguments change every launch: use at(count)")
    assert lines[2] == "replayed [16, 16, 16, 16]"
    assert lines[3] == "replayed first [10, 10, 10, 10]"


ROUTES = textwrap.dedent('''
    import torch
    from gemmar.algorithms import get
    from gemmar.config import RunConfig
    from gemmar.runtime import rank as rank_runtime
    from gemmar.runtime.compiled_launch import PreparedLaunch
    from gemmar.runtime.heap.cpu import make_heap_folder, remove_arenas
    from gemmar.runtime.launch import FusedGemmAllReduce

    calls = []
    replay, at = PreparedLaunch.replay, PreparedLaunch.at
    PreparedLaunch.replay = lambda self: (calls.append("replay"), replay(self))[1]
    PreparedLaunch.at = lambda self, count, **changed: (calls.append("at"), at(self, count, **changed))[1]
    folder = make_heap_folder()
    try:
        rank_runtime.init_ranks([0], 1, "cpu", 1 << 24, folder, 30.0)
        heap = rank_runtime.local_ranks()[0].heap
        config = RunConfig(m=24, n=40, k=32, world_size=1, algorithm="two_shot", BLK_M=16, BLK_N=16, BLK_K=16,
                           datatype="fp32").validate()
        for parts in (None, get("two_shot").mistake_swaps("skip_partial_wait")):
            fused = FusedGemmAllReduce(heap, config, parts=parts)
            for seed in range(2):
                A = torch.randn(24, 32, generator=torch.Generator().manual_seed(seed))
                B = torch.randn(32, 40, generator=torch.Generator().manual_seed(seed + 9))
                for _ in range(2):
                    C = fused(A, B)
                    print(bool((C - A @ B).abs().max() < 1e-4), calls)
                    calls.clear()
    finally:
        remove_arenas(folder)
''')


def test_a_one_rank_launch_is_replayed_and_one_with_its_own_parts_is_not():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", ROUTES], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    # (replay, then, with no compiled kernel under the interpreter, at: a GPU's replay launches a graph instead)
    assert lines[:4] == ["True ['replay', 'at']"] * 4
    # a mistake's part: the two kernels with their epochs, each launched with at
    assert [line.split(" ", 1)[1] for line in lines[4:]] == ["['at', 'at']"] * 4
