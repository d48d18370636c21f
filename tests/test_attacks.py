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
