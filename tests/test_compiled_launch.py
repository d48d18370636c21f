"""PreparedLaunch under the interpreter (in a subprocess: the interpreter is chosen when Triton is imported):
``at`` sets the per-launch arguments from the launch count and any argument given anew; ``replay`` launches
again with every argument as it was, and is refused for a kernel whose arguments change every launch."""

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
