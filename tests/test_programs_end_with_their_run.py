"""A program under `gemmar run` ends with its run, whatever it does: nothing it starts outlives it, the run's exit
status is the rank that failed first (also by os._exit), a barrier a rank never reaches is a deadlock named at the
deadline, what it changes in its rank's process is undone for the next program, and it cannot signal the processes
above its rank (docs/guarantees.md). Real programs, real engines, real signals."""

import os
import subprocess
import sys

import pytest

from inputs import process_alive
from run_as_user import GEMMAR, gone_within

# A program whose every rank starts two children that try to outlive the run: one leaves the rank's session
# (setsid) and ignores SIGTERM; the other double-forks, leaves the session and drops gemmar's environment too.
ESCAPING_PROGRAM = """
import os, signal, subprocess, sys, time
rank = os.environ.get("RANK", str(os.getpid()))
sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True)
pids = [child.pid]
reader, writer = os.pipe()
if os.fork() == 0:                       # the double fork: the grandchild is orphaned at once
    os.setsid()
    if os.fork() == 0:
        env = {{k: v for k, v in os.environ.items() if not k.startswith("GEMMAR")}}
        os.write(writer, str(os.getpid()).encode().ljust(16))
        os.execve(sys.executable, [sys.executable, "-c", sleeper], env)
    os._exit(0)
pids.append(int(os.read(reader, 16)))
with open(os.path.join({out!r}, f"pids-{{os.getpid()}}"), "w") as f:
    f.write(" ".join(map(str, pids)))
time.sleep({sleep})
"""


def _escapees(folder):
    pids = []
    for name in os.listdir(folder):
        if name.startswith("pids-"):
            pids += [int(p) for p in open(os.path.join(folder, name)).read().split()]
    return pids



@pytest.mark.parametrize("ending", ["normal", "deadline"])
def test_nothing_a_rank_starts_outlives_the_run(tmp_path, ending):
    """Attack 1: a child that calls setsid() (and one that also drops gemmar's environment) ends with the run,
    whether the program ends on its own or is stopped at the deadline."""
    program = tmp_path / "escape.py"
    program.write_text(ESCAPING_PROGRAM.format(out=str(tmp_path), sleep=0 if ending == "normal" else 300))
    timeout = ["--timeout", "10"] if ending == "deadline" else []
    p = subprocess.run(GEMMAR + ["run", "-r", "2", *timeout, str(program)], capture_output=True, text=True,
                       timeout=180)
    pids = _escapees(tmp_path)
    try:
        assert len(pids) == 4, (p.stdout, p.stderr)
        assert p.returncode == (0 if ending == "normal" else 3), p.stderr
        assert gone_within(pids, 3), f"still alive after the run: {[q for q in pids if process_alive(q)]}"
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def test_the_exit_status_is_that_of_the_rank_that_failed_first(tmp_path):
    """Attack 7: rank 1 fails first (exit 7); rank 0 fails later (exit 5): `gemmar run` exits 7, not the
    lowest-numbered rank's 5."""
    program = tmp_path / "fail_in_turn.py"
    program.write_text("import os, sys, time\n"
                       "if os.environ['RANK'] == '1':\n    sys.exit(7)\n"
                       "time.sleep(1.5)\nsys.exit(5)\n")
    p = subprocess.run(GEMMAR + ["run", "-r", "2", str(program)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 7, (p.returncode, p.stderr)


def test_a_rank_ending_with_os_exit_makes_gemmar_run_exit_with_its_code(tmp_path):
    """os._exit(3) ends the rank's process (no SystemExit): exit 1 before, as for a crash; sys.exit(3) gave 3."""
    program = tmp_path / "exit3.py"
    program.write_text("import os\nif os.environ['RANK'] == '1':\n    os._exit(3)\n")
    p = subprocess.run(GEMMAR + ["run", "-r", "2", str(program)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 3, p.stderr
    assert "rank 1: its process" in p.stderr and "exited with code 3" in p.stderr, p.stderr


def test_a_barrier_a_rank_never_reaches_is_a_deadlock_at_the_deadline(tmp_path):
    """Rank 1 sleeps while rank 0 waits in the barrier: "still running" for both before; now rank 0's line says
    deadlock and where, rank 1's where it is instead; exit 3."""
    program = tmp_path / "never_arrives.py"
    program.write_text("import time, iris\nshmem = iris.iris(1 << 20)\nif shmem.get_rank() == 1:\n"
                       "    time.sleep(300)\nshmem.barrier()\n")
    p = subprocess.run(GEMMAR + ["run", "-r", "2", "--timeout", "5", str(program)], capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 3, p.stderr
    line, = [line for line in p.stderr.splitlines() if line.startswith("gemmar run:")]
    assert ("rank 0: deadlock: waits in the barrier at never_arrives.py:5 (shmem.barrier()), which rank 1 never "
            "reached") in line, line
    assert "rank 1: never reached the barrier rank 0 waits in: it was at never_arrives.py:4 (time.sleep(300))" in line


STATE_CHANGES = """
import os, sys
print("before")
os.environ.clear()
os.umask(0o777)
os.chdir("/")
sys.setrecursionlimit(10 ** 6)
sys.stdout = sys.stderr = None
"""

STATE_AFTER = """
import os, sys
import torch, triton, triton.language as tl

@triton.jit
def iota(x):
    tl.store(x + tl.arange(0, 4), tl.arange(0, 4).to(tl.float32))

x = torch.zeros(4)
iota[(1,)](x)                     # (Triton: "0 active drivers" when the environment was left cleared)
print(x.tolist(), os.environ.get("TRITON_INTERPRET"), oct(os.umask(0o022)), os.getcwd(), sys.getrecursionlimit())
"""

RECURSION = """
import sys
sys.setrecursionlimit(10 ** 6)
def deeper(n):
    return deeper(n + 1) + 1
deeper(0)
"""


def test_what_a_program_changes_in_its_rank_is_undone_for_the_next(tmp_path):
    """In one Cluster: a program that sets sys.stdout = None (its results were lost, the run waited out its
    deadline), clears the environment, sets umask 0o777, changes folder and the recursion limit; the next
    program finds the rank as it was. Then a RecursionError at a recursion limit of 10**6 (a million frames,
    whose traceback took 71 s to walk) is one line naming the line."""
    import io

    import gemmar

    for name, text in (("changes.py", STATE_CHANGES), ("after.py", STATE_AFTER), ("recursion.py", RECURSION)):
        (tmp_path / name).write_text(text)
    out = io.StringIO()
    with gemmar.Cluster(world_size=2, process_per_rank=True, timeout_s=30) as cluster:
        first = cluster.run_script(tmp_path / "changes.py", timeout=60, out=out)
        assert first.exit_codes == [0, 0] and out.getvalue().count("before") == 2, (first.errors, out.getvalue())
        after = cluster.run_script(tmp_path / "after.py", timeout=60, out=out)
        assert after.exit_codes == [0, 0], after.errors
        expected = f"[0.0, 1.0, 2.0, 3.0] 1 0o22 {os.getcwd()} {sys.getrecursionlimit()}"
        assert out.getvalue().count(expected) == 2, out.getvalue()
        deep = cluster.run_script(tmp_path / "recursion.py", timeout=120, out=out)
        assert deep.errors == ["RecursionError: maximum recursion depth exceeded (recursion.py:5)"] * 2, deep.errors


def test_a_rank_that_kills_its_parent_isrefused_in_one_line(tmp_path):
    """os.kill(os.getppid(), 9) on a rank killed `gemmar run`'s client: "Killed", exit 137, no line of gemmar's."""
    program = tmp_path / "kill_parent.py"
    program.write_text("import os\nif os.environ['RANK'] == '1':\n    os.kill(os.getppid(), 9)\n")
    p = subprocess.run(GEMMAR + ["run", "-r", "2", str(program)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 1, p.stderr
    line, = [line for line in p.stderr.splitlines() if line.startswith("gemmar run:")]
    assert "rank 1: PermissionError: os.kill(" in line and ", SIGKILL) refused: pid " in line, line
    assert "(kill_parent.py:3)" in line, line
