"""An attacker's third round (issue 51), each attack for real: hostile programs under ``gemmar run``, limits set
with ``ulimit`` and cgroup-like budgets, hostile files. Each must end within seconds with one line naming the
cause and what to change, a non-zero exit, and nothing left behind."""

import os
import subprocess
import sys
import time

import psutil
import pytest

GEMMAR = [sys.executable, "-m", "gemmar.cli"]

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


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone_within(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


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
        assert _gone_within(pids, 3), f"still alive after the run: {[q for q in pids if _alive(q)]}"
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


def _memory_cgroup_folder():
    """A new cgroup under this process's memory cgroup (v1 or v2), or None when this machine does not let
    us make one (not root, cgroups read-only, no memory controller)."""
    from gemmar.runtime import memory

    mounts = memory._mounts()
    for line in open("/proc/self/cgroup").read().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        version = "v2" if hierarchy == "0" and controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version not in mounts or (version == "v2" and "v1" in mounts):
            continue
        mount, root = mounts[version]
        path = path[len(root):] if root != "/" and path.startswith(root) else path
        folder = os.path.join(mount + path, f"gemmar-test-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.mkdir(folder)
        except OSError:
            return None
        limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
        if not os.path.exists(os.path.join(folder, limit_file)):
            os.rmdir(folder)
            return None
        return folder, limit_file
    return None


@pytest.fixture
def memory_cgroup():
    """(run(args, limit_bytes) -> CompletedProcess): a gemmar command in a memory cgroup of its own, as in a
    container with that memory limit. Skipped, saying why, where no cgroup can be made."""
    made = _memory_cgroup_folder()
    if made is None:
        pytest.skip("no memory cgroup can be made here (needs root and a writable cgroup fs): the container "
                    "limit attacks are not run")
    folder, limit_file = made

    def run(args, limit, timeout=180):
        with open(os.path.join(folder, limit_file), "w") as f:
            f.write(str(limit))
        join = f"echo $$ > {folder}/cgroup.procs && exec \"$@\""
        return subprocess.run(["sh", "-c", join, "sh", *GEMMAR, *args], capture_output=True, text=True,
                              timeout=timeout)

    yield run
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:   # (empty once every process of the run is gone)
        try:
            os.rmdir(folder)
            break
        except OSError:
            time.sleep(0.2)


def test_a_run_that_cannot_fit_the_containers_memory_is_refused_in_one_line(memory_cgroup):
    """Attack 3: in a 1.5 GiB container, 16 ranks are refused before any starts, naming the container's limit
    (the host's free memory would have let them start, and the OOM killer end them)."""
    p = memory_cgroup(["bench", "-r", "16", "--iterations", "1"], 3 << 29)
    assert p.returncode == 2, p.stderr
    line, = p.stderr.strip().splitlines()
    assert "16 engine process(es)" in line and "this container's memory limit is 1.5 GiB" in line, line
    assert "use fewer ranks" in line, line


OOM_PROGRAM = """
import os, time, torch
if os.environ["RANK"] == "1":
    hog = []
    while True:                      # until the OOM killer ends this rank
        hog.append(torch.ones(1 << 26))
time.sleep(600)                      # rank 0 would wait for rank 1 for ever
"""


def test_a_rank_killed_by_the_oom_killer_is_named_and_ends_the_run_in_seconds(memory_cgroup, tmp_path):
    """Attack 3: a rank the kernel OOM-kills at the container's limit ends the run within seconds (not at
    --timeout), and the line says out of memory and the limit."""
    program = tmp_path / "hog.py"
    program.write_text(OOM_PROGRAM)
    started = time.monotonic()
    p = memory_cgroup(["run", "-r", "2", "--timeout", "300", str(program)], 3 << 30)
    took = time.monotonic() - started
    assert p.returncode == 137, (p.returncode, p.stderr)
    assert took < 90, took
    failure = [line for line in p.stderr.splitlines() if "rank 1:" in line]
    assert failure and "killed by SIGKILL (out of memory" in failure[0], p.stderr
    assert "this container's memory limit is 3 GiB" in failure[0], failure[0]


def _refused_in_one_line(command, within_s=10, env=None):
    """Run ``command``; it must exit 3 within ``within_s`` with one error line (besides gemmar's progress
    lines) and no traceback. Returns that line."""
    started = time.monotonic()
    p = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - started
    errors = [line for line in p.stderr.splitlines() if not line.startswith("[gemmar]")]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert len(errors) == 1 and p.returncode == 3, (p.returncode, p.stderr[-3000:])
    assert took < within_s, f"refused after {took:.1f} s"
    return errors[0]


def _needs(*tools, root=True):
    import shutil

    missing = [t for t in tools if not shutil.which(t)]
    if missing or (root and os.geteuid() != 0):
        pytest.skip(f"needs {'root and ' if root else ''}{', '.join(tools)} to set the limit ({missing or 'not root'})")


@pytest.mark.parametrize("files, ranks", [(16, 2), (32, 2), (64, 8)])
def test_too_few_open_files_is_one_line_naming_the_limit(files, ranks):
    """Attack 4: ulimit -n 16/32 (a traceback from ipyparallel's controller before) and -r 8 at ulimit -n 64
    (66 s, then a timeout that named no limit)."""
    _needs("prlimit", root=False)
    line = _refused_in_one_line(["prlimit", f"--nofile={files}", *GEMMAR, "bench", "-r", str(ranks),
                                 "--iterations", "1"])
    assert f"the open-files limit (ulimit -n) is {files}; a cluster of {ranks} ranks needs about" in line, line


def test_too_few_processes_is_one_line_naming_the_limit():
    """Attack 4: ulimit -u 20 for a user who is not root (root is not held to it): uid 65534, allowed to read
    this Python's files."""
    _needs("setpriv", "prlimit")
    caps = "+dac_read_search,+dac_override"
    line = _refused_in_one_line(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps={caps}",
                                 f"--ambient-caps={caps}", "prlimit", "--nproc=20", *GEMMAR, "bench", "-r", "2",
                                 "--iterations", "1"], env={**os.environ, "HOME": "/nonexistent"})
    assert "the process limit (ulimit -u) is 20;" in line and "raise it (ulimit -u" in line, line


@pytest.mark.parametrize("attack", ["tmp full", "shm inodes", "shm read-only"])
def test_a_full_or_read_only_folder_is_one_line_naming_it(tmp_path, attack):
    """Attack 4: a full TMPDIR, /dev/shm out of inodes, /dev/shm read-only: each in a mount namespace of its
    own (unshare -m), so that nothing outside this test sees the small file systems."""
    _needs("unshare", "mount")
    gemmar = " ".join(GEMMAR + ["bench", "-r", "2", "--iterations", "1"])
    tmp = tmp_path / "small"
    tmp.mkdir()
    setup = {"tmp full": f"mount -t tmpfs -o size=1m tmpfs {tmp} && head -c 1040000 /dev/zero > {tmp}/fill && "
                         f"export TMPDIR={tmp}",
             "shm inodes": "mount -t tmpfs -o size=2g,nr_inodes=8 tmpfs /dev/shm",
             "shm read-only": "mount -t tmpfs -o ro tmpfs /dev/shm"}[attack]
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    line = _refused_in_one_line(["unshare", "-m", "sh", "-c", f"{setup} && exec {gemmar}"])
    expected = {"tmp full": f"the temp folder (TMPDIR) {tmp} is full", "shm inodes": "/dev/shm is out of inodes",
                "shm read-only": "/dev/shm is not writable (read-only)"}[attack]
    assert expected in line, line


# -- An attacker's fourth round (issue 61 item 6) ---------------------------------------------------------------

def _iris_trace(path, ranks, program=0, pid_m=0, pid_n=0):
    """An Iris device trace of ``ranks`` ranks, an event per rank; rank 0's names ``program``, ``pid_m``, ``pid_n``."""
    import json

    events = [dict(name="compute", cat="iris", ph="X", ts=float(r), dur=1.0, pid=r, tid=0,
                   args=dict(program_id=program if r == 0 else 0, pid_m=pid_m if r == 0 else 0,
                             pid_n=pid_n if r == 0 else r % 4, target_rank=-1, op_index=r)) for r in range(ranks)]
    path.write_text(json.dumps(dict(traceEvents=events, metadata=dict(time_unit="us"))))
    return str(path)


def test_a_trace_naming_program_2_to_the_20_draws_its_tile_grid(tmp_path, capsys):
    """A trace of 9 ranks whose one event names program 2**20 - 1: a colour per program (3.2 GiB, then an
    OverflowError in matplotlib) before; now a ramp of colours, ranks in rows of 8. A grid too large to draw is
    refused in one line before anything is allocated."""
    from gemmar import cli

    trace = _iris_trace(tmp_path / "wide.trace.json", 9, program=(1 << 20) - 1)
    assert cli.main(["gantt", trace, "-o", str(tmp_path / "g.png"), "--tile_grid", str(tmp_path / "t.png")]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "t.png").stat().st_size > 1000 and (tmp_path / "g.png").stat().st_size > 1000
    huge = _iris_trace(tmp_path / "huge.trace.json", 8, pid_m=1023, pid_n=1023)
    assert cli.main(["gantt", huge, "-o", str(tmp_path / "g2.png"), "--tile_grid", str(tmp_path / "t2.png")]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert "tile grid of 8 ranks x 1024 x 1024 tiles is too large to draw" in line, line
    assert not (tmp_path / "t2.png").exists()


@pytest.mark.parametrize("path, message", [("", "--output_file '' is not a file name"),
                                           ("/proc/version", "/proc/version cannot be written: a new file in /proc")])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(capsys, path, message):
    """--output_file '' wrote nothing and said nothing; /proc/version failed after the run."""
    from gemmar import cli

    assert cli.main(["bench", "-r", "2", "-m", "32", "-n", "32", "-k", "32", "--output_file", path]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert message in line, line


def test_another_users_report_in_a_sticky_folder_is_refused_before_the_run(tmp_path):
    """In /tmp (sticky), a report of another user's cannot be replaced by a rename (nor, with
    fs.protected_regular, opened): refused before the run (uid 65534 against root's file)."""
    import shutil
    import tempfile

    _needs("setpriv")
    folder = tempfile.mkdtemp(prefix="gemmar-sticky-", dir="/tmp")   # (tmp_path's parents are root's, 0700)
    try:
        os.chmod(folder, 0o1777)
        theirs = os.path.join(folder, "report.json")
        with open(theirs, "w") as f:
            f.write('{"theirs": true}\n')
        os.chmod(theirs, 0o666)
        caps = "+dac_read_search,+dac_override"
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps={caps}",
                            f"--ambient-caps={caps}", *GEMMAR, "bench", "-r", "2", "--output_file", theirs],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": "/nonexistent"})
        assert p.returncode == 2, p.stderr
        line, = p.stderr.strip().splitlines()
        assert "belongs to another user (uid 0) in the sticky folder" in line, line
        assert open(theirs).read() == '{"theirs": true}\n'
    finally:
        shutil.rmtree(folder)


def test_a_disk_that_fills_during_the_run_keeps_the_earlier_report_and_says_where_the_new_one_is(tmp_path):
    """The report's folder (a 64 KiB tmpfs of its own, in a mount namespace) fills while the run runs: the earlier
    report is left whole, one line says the report was not written and where it is instead (TMPDIR), exit 4."""
    _needs("unshare", "mount")
    full, out = tmp_path / "full", tmp_path / "out"
    full.mkdir()
    out.mkdir()
    gemmar = " ".join(GEMMAR + ["bench", "-r", "2", "-m", "32", "-n", "32", "-k", "32", "-v", "--output_file",
                                f"{full}/report.json"])
    script = (f"mount -t tmpfs -o size=64k tmpfs {full} && echo '{{\"earlier\": true}}' > {full}/report.json && "
              f"{{ TMPDIR={out} {gemmar} > {out}/stdout 2> {out}/stderr & }} && "
              f"while ! grep -q 'ranks up' {out}/stdout; do sleep 0.1; done; "
              f"head -c 1000000 /dev/zero > {full}/fill 2>/dev/null; wait $!; echo $? > {out}/rc; "
              f"cat {full}/report.json > {out}/earlier")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    subprocess.run(["unshare", "-m", "sh", "-c", script], timeout=180)
    stderr = (out / "stderr").read_text()
    assert (out / "rc").read_text().strip() == "4", stderr
    assert "PASSED" in (out / "stdout").read_text()
    line, = [line for line in stderr.splitlines() if not line.startswith("[gemmar]")]
    assert f"the report was not written to {full}/report.json (No space left on device); an earlier file there " \
           f"is left as it was; it is at {out}/gemmar-" in line, line
    assert (out / "earlier").read_text() == '{"earlier": true}\n'
    copy, = out.glob("gemmar-*-report.json")
    assert '"success": true' in copy.read_text()


def test_a_report_whose_rename_fails_stays_at_its_temporary_name(tmp_path):
    """Where only the rename fails (the path became a folder meanwhile), the line names the temporary file."""
    from gemmar.outputs import write_whole

    (tmp_path / "report.json").mkdir()
    (tmp_path / "report.json" / "inside").write_text("")
    line = write_whole(str(tmp_path / "report.json"), lambda path: open(path, "w").write("{}"))
    kept = line.rsplit("it is at ", 1)[1]
    assert line.startswith(f"the report was not written to {tmp_path}/report.json (") and open(kept).read() == "{}"


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


def test_a_rank_that_kills_its_parent_is_refused_in_one_line(tmp_path):
    """os.kill(os.getppid(), 9) on a rank killed `gemmar run`'s client: "Killed", exit 137, no line of gemmar's."""
    program = tmp_path / "kill_parent.py"
    program.write_text("import os\nif os.environ['RANK'] == '1':\n    os.kill(os.getppid(), 9)\n")
    p = subprocess.run(GEMMAR + ["run", "-r", "2", str(program)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 1, p.stderr
    line, = [line for line in p.stderr.splitlines() if line.startswith("gemmar run:")]
    assert "rank 1: PermissionError: os.kill(" in line and ", SIGKILL) refused: pid " in line, line
    assert "(kill_parent.py:3)" in line, line


SHM_FILLER = """
import iris, torch
shmem = iris.iris(48 << 20)
if shmem.get_rank() == 0:
    with open("/dev/shm/fill", "wb") as f:          # /dev/shm fills after the start-up check
        try:
            while True:
                f.write(bytes(1 << 20))
                f.flush()
        except OSError:
            pass
    x = shmem.zeros(8 << 20, dtype=torch.float32)   # new heap pages, and no room left for them
shmem.barrier()
"""


def test_a_dev_shm_that_fills_during_the_run_is_named(tmp_path):
    """/dev/shm (a 200 MiB tmpfs of this test's own, in a mount namespace) fills after the start-up check: the
    rank touching new heap pages dies by SIGBUS, and its line now says /dev/shm is full and why it matters."""
    _needs("unshare", "mount")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    program = tmp_path / "fill_shm.py"
    program.write_text(SHM_FILLER)
    gemmar = " ".join(GEMMAR + ["run", "-r", "2", "--heap_size", "64M", "--timeout", "60", str(program)])
    p = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=200m tmpfs /dev/shm && exec {gemmar}"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 128 + 7, p.stderr   # (SIGBUS)
    line, = [line for line in p.stderr.splitlines() if line.startswith("gemmar run:")]
    assert "rank 0: its process" in line and "was killed by SIGBUS (/dev/shm is full: " in line, line


def ctrl_c_as_in_a_terminal():
    """A command typed in a terminal has Ctrl-C's default action; one started in the background by a shell
    without job control (a CI script run with `&`) inherits SIGINT ignored, and rightly keeps ignoring it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("moment", ["while the engines start", "mid-run, twice", "just after PASSED"])
def test_ctrl_c_at_any_moment_is_one_line_and_leaves_nothing(moment):
    """Ctrl-C while the engines start (3.8 s, and once an asyncio "Task was destroyed" dump), twice mid-run (a
    traceback from the second), just after PASSED (an EngineCluster.__del__ traceback): now the command ends at
    once with its one line and exit 130, and the cluster's reaper ends what it had started."""
    import contextlib
    import signal

    iterations = "100000" if moment == "mid-run, twice" else "1"
    cli = subprocess.Popen(GEMMAR + ["bench", "-r", "2", "-m", "32", "-n", "32", "-k", "32", "-v", "--iterations",
                                     iterations], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=ctrl_c_as_in_a_terminal)
    cue = {"while the engines start": "starting 2 ipyparallel", "mid-run, twice": "iteration ",
           "just after PASSED": "PASSED"}[moment]   # (mid-run: any iteration after the first; -v skips some lines)
    try:
        import threading

        seen, cued = [], threading.Event()   # (the cue must come within 180 s: a test never waits without end)

        def read():
            for line in cli.stdout:
                seen.append(line)
                if cue in line and " iteration 1/" not in line:
                    cued.set()
                    return

        threading.Thread(target=read, daemon=True).start()
        assert cued.wait(180), f"no {cue!r} from the command within 180 s: {seen}"
        children = psutil.Process(cli.pid).children(recursive=True)
        cli.send_signal(signal.SIGINT)
        if moment == "mid-run, twice":   # (while the first one's cleanup ran: exit -2, killed by SIGINT, before)
            time.sleep(0.3)
            with contextlib.suppress(ProcessLookupError):
                cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
    finally:
        cli.kill()
    if moment == "just after PASSED" and cli.returncode in (0, -2):
        # (it ended before the signal came; or the signal came while Python was ending, after it had put Ctrl-C's
        # default action back: no line then, but no traceback either)
        assert err == "", err
    else:
        assert (cli.returncode, err) == (130, "gemmar: interrupted\n"), (cli.returncode, err)
    assert _gone_within([p.pid for p in children], 15), [p for p in children if _alive(p.pid)]
