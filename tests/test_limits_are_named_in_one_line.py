"""Every limit of the machine is named in one line before or as it is hit: a container's memory (a real memory
cgroup), the OOM killer ending a rank, open files, processes, a full or read-only temp folder or /dev/shm, and
/dev/shm filling during a run (docs/guarantees.md). The limits are set for real: cgroups, prlimit, setpriv, mount
namespaces; a test the machine cannot set up is skipped, saying why."""

import os
import subprocess
import time

import pytest

from run_as_user import GEMMAR, needs, needs_mount_namespace

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


def refused_in_one_line(command, within_s=10, env=None):
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


@pytest.mark.parametrize("files, ranks", [(16, 2), (32, 2), (64, 8)])
def test_too_few_open_files_is_one_line_naming_the_limit(files, ranks):
    """Attack 4: ulimit -n 16/32 (a traceback from ipyparallel's controller before) and -r 8 at ulimit -n 64
    (66 s, then a timeout that named no limit)."""
    needs("prlimit", root=False)
    line = refused_in_one_line(["prlimit", f"--nofile={files}", *GEMMAR, "bench", "-r", str(ranks),
                                 "--iterations", "1"])
    assert f"the open-files limit (ulimit -n) is {files}; a cluster of {ranks} ranks needs about" in line, line


def test_too_few_processes_is_one_line_naming_the_limit():
    """Attack 4: ulimit -u 20 for a user who is not root (root is not held to it): uid 65534, allowed to read
    this Python's files."""
    needs("setpriv", "prlimit")
    caps = "+dac_read_search,+dac_override"
    line = refused_in_one_line(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps={caps}",
                                 f"--ambient-caps={caps}", "prlimit", "--nproc=20", *GEMMAR, "bench", "-r", "2",
                                 "--iterations", "1"], env={**os.environ, "HOME": "/nonexistent"})
    assert "the process limit (ulimit -u) is 20;" in line and "raise it (ulimit -u" in line, line


@pytest.mark.parametrize("attack", ["tmp full", "shm inodes", "shm read-only"])
def test_a_full_or_read_only_folder_is_one_line_naming_it(tmp_path, attack):
    """Attack 4: a full TMPDIR, /dev/shm out of inodes, /dev/shm read-only: each in a mount namespace of its
    own (unshare -m), so that nothing outside this test sees the small file systems."""
    needs_mount_namespace()
    gemmar = " ".join(GEMMAR + ["bench", "-r", "2", "--iterations", "1"])
    tmp = tmp_path / "small"
    tmp.mkdir()
    setup = {"tmp full": f"mount -t tmpfs -o size=1m tmpfs {tmp} && head -c 1040000 /dev/zero > {tmp}/fill && "
                         f"export TMPDIR={tmp}",
             "shm inodes": "mount -t tmpfs -o size=2g,nr_inodes=8 tmpfs /dev/shm",
             "shm read-only": "mount -t tmpfs -o ro tmpfs /dev/shm"}[attack]
    line = refused_in_one_line(["unshare", "-m", "sh", "-c", f"{setup} && exec {gemmar}"])
    expected = {"tmp full": f"the temp folder (TMPDIR) {tmp} is full", "shm inodes": "/dev/shm is out of inodes",
                "shm read-only": "/dev/shm is not writable (read-only)"}[attack]
    assert expected in line, line


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
    needs_mount_namespace()
    program = tmp_path / "fill_shm.py"
    program.write_text(SHM_FILLER)
    gemmar = " ".join(GEMMAR + ["run", "-r", "2", "--heap_size", "64M", "--timeout", "60", str(program)])
    p = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=200m tmpfs /dev/shm && exec {gemmar}"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 128 + 7, p.stderr   # (SIGBUS)
    line, = [line for line in p.stderr.splitlines() if line.startswith("gemmar run:")]
    assert "rank 0: its process" in line and "was killed by SIGBUS (/dev/shm is full: " in line, line
