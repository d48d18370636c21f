"""The cluster lives exactly as long as its owner, with real processes and real signals: an owner killed
by SIGKILL or SIGTERM, a controller killed mid-run, Ctrl-C in the CLI and in Python, stop() from another
thread during a run, and nothing written into the user's home."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
from run_as_user import GEMMAR, ctrl_c_as_in_a_terminal, gone_within
import pytest

import gemmar
from inputs import process_alive, wait_until

# A client that starts a cluster, says what it is made of, then runs for minutes unless stopped.
OWNER = textwrap.dedent('''
    import json, gemmar
    cluster = gemmar.Cluster(world_size=2, backend="cpu")
    print(json.dumps(dict(sessions=sorted(cluster._sessions), profile=cluster.profile_dir,
                          heaps=cluster.heap_folder)), flush=True)
    cluster.bench(gemmar.RunConfig(m=64, n=64, k=64, BLK_M=16, BLK_N=16, BLK_K=16, iterations=100000),
                  on_progress=lambda rank, data: print("running", flush=True))
''')


def members(sessions):
    """Live (not zombie) processes of these sessions."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) in sessions and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def leftovers(info):
    """What of a cluster is still there: processes, its profile folder, its heap folder."""
    return members(set(info["sessions"])) + [path for path in (info["profile"], info["heaps"]) if os.path.exists(path)]


def test_a_living_owner_stays_alive_to_its_engines_when_the_system_clock_is_stepped(monkeypatch):
    """Engines watch their owner by its start stamp. psutil's create_time() adds the boot time, which moves
    when the clock is stepped (NTP, a VM's clock sync): an engine comparing it took its living owner for dead
    and ended a CI run's 4-rank cluster ("exited with code 1", the others SIGKILL). The stamp must not move
    with the boot time; a process that has ended has none; another process has another."""
    from psutil import _pslinux

    from gemmar.runtime.processes import start_stamp

    own, child = start_stamp(os.getpid()), subprocess.Popen([sys.executable, "-c", "pass"])
    boot, created = _pslinux.boot_time(), psutil.Process(os.getpid()).create_time()
    monkeypatch.setattr(_pslinux, "boot_time", lambda: boot + 1.0)   # the clock stepped by one second
    assert psutil.Process(os.getpid()).create_time() == pytest.approx(created + 1.0)   # what fooled the engines
    assert start_stamp(os.getpid()) == own
    child_stamp = start_stamp(child.pid)
    child.wait()
    assert start_stamp(child.pid) is None and child_stamp not in (None, own)


def test_the_reaper_is_told_of_a_folder_before_the_folder_exists(tmp_path):
    """A cluster's folders (its ipyparallel profile, its heap folder in /dev/shm) are announced to its reaper
    before they are made: a Ctrl-C between a mkdtemp and telling the reaper (the CLI ends at once, os._exit(130))
    left an empty heap folder in /dev/shm for good."""
    from gemmar.runtime.heap.cpu import private_folder

    told = []
    path = private_folder(str(tmp_path), "gemmar-heaps-", lambda p: told.append((p, os.path.exists(p))))
    assert told and told[-1] == (path, False) and os.path.isdir(path)
    assert os.stat(path).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_cluster_dies_with_its_owner(tmp_path, sig):
    (tmp_path / "owner.py").write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(tmp_path / "owner.py")], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(owner.stdout.readline())
        assert len(info["sessions"]) >= 3   # the controller's, and at least one per engine
        assert owner.stdout.readline().strip() == "running"
        assert members(set(info["sessions"]))
        owner.send_signal(sig)
        owner.wait(10)
        killed_at = time.monotonic()
        assert wait_until(lambda: not leftovers(info), timeout_s=15), leftovers(info)
        print(f"{signal.Signals(sig).name}: cluster gone {time.monotonic() - killed_at:.1f} s after its owner")
    finally:
        owner.kill()


def test_a_killed_controller_leaves_nothing_after_stop():
    cluster = gemmar.Cluster(world_size=2, backend="cpu")
    info = dict(sessions=sorted(cluster._sessions), profile=cluster.profile_dir, heaps=cluster.heap_folder)
    controller = psutil.Process(cluster._ipp.controller.pid)
    assert controller.children(), "the controller runs its schedulers as child processes"
    controller.kill()
    try:
        # The engines still hold their connections: the run itself can finish.
        result = cluster.bench(gemmar.RunConfig(m=32, n=32, k=32, BLK_M=16, BLK_N=16, BLK_K=16))
        assert result.ok
    except gemmar.GemmarError:
        pass   # or it reports the lost controller; either way, stop() must clean up
    finally:
        cluster.stop()
    assert wait_until(lambda: not leftovers(info), timeout_s=10), leftovers(info)


def test_ctrl_c_ends_a_cli_run_at_once_in_one_line():   # (ctrl_c_as_in_a_terminal: run_as_user.py says why)
    cli = subprocess.Popen([sys.executable, "-m", "gemmar.cli", "bench", "-r", "2", "-m", "64", "-n", "64", "-k", "64",
                            "--iterations", "100000", "-v"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=ctrl_c_as_in_a_terminal)
    try:
        for line in cli.stdout:
            if " iteration " in line and " iteration 1/" not in line:   # (mid-run: -v skips some iterations' lines)
                break
        children = psutil.Process(cli.pid).children(recursive=True)
        pressed = time.monotonic()
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
        took = time.monotonic() - pressed
    finally:
        cli.kill()
    assert cli.returncode == 130 and err.strip() == "gemmar: interrupted", (cli.returncode, err)
    assert took < 2.0, f"Ctrl-C took {took:.1f} s to end the run"
    # (process_alive: a child may end between two looks at it, which psutil then raises)
    assert wait_until(lambda: not [p for p in children if process_alive(p.pid)], timeout_s=10)


INTERRUPTED = textwrap.dedent('''
    import os, signal, threading, time, gemmar, psutil
    cluster = gemmar.Cluster(world_size=2, backend="cpu")
    long_run = gemmar.RunConfig(m=64, n=64, k=64, BLK_M=16, BLK_N=16, BLK_K=16, iterations=100000)
    running = threading.Event()
    def press_ctrl_c():
        running.wait(60)
        global pressed
        pressed = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    old_pids = list(cluster.pids)
    try:
        cluster.bench(long_run, on_progress=lambda rank, data: running.set())
    except KeyboardInterrupt:
        print("interrupted after", round(time.monotonic() - pressed, 2), flush=True)
    print("old ranks alive", any(p.pid in old_pids and p.info["status"] != psutil.STATUS_ZOMBIE
                                 for p in psutil.process_iter(["status"])), flush=True)
    result = cluster.bench(gemmar.RunConfig(m=64, n=64, k=64, BLK_M=16, BLK_N=16, BLK_K=16, iterations=2))
    print("next call ok", result.ok, "new ranks", cluster.pids != old_pids, flush=True)
    cluster.stop()
''')


def test_an_interrupted_call_stops_its_ranks_and_the_next_call_restarts_them(tmp_path):
    (tmp_path / "interrupted.py").write_text(INTERRUPTED)
    p = subprocess.run([sys.executable, str(tmp_path / "interrupted.py")], capture_output=True, text=True, timeout=240,
                       preexec_fn=ctrl_c_as_in_a_terminal)   # (a pytest started with & ignores SIGINT: run_as_user.py)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == 3, (p.stdout, p.stderr[-2000:])
    assert lines[0].startswith("interrupted after") and float(lines[0].split()[-1]) < 2.0, lines
    assert lines[1:] == ["old ranks alive False", "next call ok True new ranks True"]
    # The restart is said, in one line.
    assert "restarting the cluster: its last run was interrupted" in p.stderr


def test_stop_from_another_thread_ends_the_run_at_once():
    cluster = gemmar.Cluster(world_size=2, backend="cpu")
    running, stopped_at = threading.Event(), []

    def stop_when_running():
        running.wait(60)
        stopped_at.append(time.monotonic())
        cluster.stop()

    threading.Thread(target=stop_when_running, daemon=True).start()
    try:
        with pytest.raises(gemmar.ClusterError, match="stopped by the user"):
            cluster.bench(gemmar.RunConfig(m=64, n=64, k=64, BLK_M=16, BLK_N=16, BLK_K=16, iterations=100000),
                          on_progress=lambda rank, data: running.set())
        assert time.monotonic() - stopped_at[0] < 2.0
    finally:
        cluster.stop()
    assert not cluster.running


def test_stop_from_several_threads_at_once_is_one_stop():
    """A Stop button and the run's own cleanup can both stop a cluster at the same moment (once this raised a
    KeyError from inside ipyparallel in the second caller)."""
    cluster = gemmar.Cluster(world_size=2, backend="cpu").start()
    together, errors = threading.Barrier(3), []

    def stop():
        together.wait(30)
        try:
            cluster.stop()
        except Exception as e:   # noqa: BLE001 - any error is the failure this test looks for
            errors.append(e)

    threads = [threading.Thread(target=stop) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and not cluster.running


def test_a_cluster_writes_nothing_into_the_home_folder(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    script = ("import os, gemmar\n"
              "with gemmar.Cluster(world_size=2, backend='cpu') as c:\n"
              "    profile = c.profile_dir\n"
              "    assert os.listdir(os.path.join(profile, 'log'))   # the logs are there while it runs\n"
              "print(os.path.exists(profile))\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(home)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "False"          # its private profile is removed on stop
    assert list(home.iterdir()) == []           # nothing in ~/.ipython, or anywhere else in the home


@pytest.mark.parametrize("ending", ["shutdown", "restart"])
def test_a_jupyter_kernel_ending_leaves_nothing_even_with_a_cell_run_twice(ending):
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        infos = []
        for _ in range(2):   # the same cell run twice: the first cluster is dropped, not stopped
            reply = client.execute_interactive(
                "import json, gemmar\n"
                "cluster = gemmar.Cluster(world_size=2, backend='cpu')\n"
                "print(json.dumps(dict(sessions=sorted(cluster._sessions), profile=cluster.profile_dir, "
                "heaps=cluster.heap_folder)))",
                timeout=120, output_hook=lambda msg: infos.append(json.loads(msg["content"]["text"]))
                if msg["msg_type"] == "stream" and msg["content"]["text"].startswith("{") else None)
            assert reply["content"]["status"] == "ok", reply["content"]
        # (The first one may already be stopped by garbage collection once nothing refers to it.)
        assert len(infos) == 2 and members(set(infos[1]["sessions"]))
        ended_at = time.monotonic()
        if ending == "shutdown":
            manager.shutdown_kernel()
        else:
            manager.restart_kernel()
        assert wait_until(lambda: not any(leftovers(i) for i in infos), timeout_s=20), [leftovers(i) for i in infos]
        print(f"kernel {ending}: both clusters gone {time.monotonic() - ended_at:.1f} s after")
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)


def test_ctrl_c_while_the_command_starts_is_one_line_too():
    # Importing torch and Triton takes the command's first second or more; Ctrl-C there is caught as well.
    cli = subprocess.Popen([sys.executable, "-m", "gemmar.console", "bench", "-r", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_as_in_a_terminal)
    time.sleep(0.4)
    cli.send_signal(signal.SIGINT)
    out, err = cli.communicate(timeout=30)
    assert out == "" and (cli.returncode, err) == (130, "gemmar: interrupted\n")


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
    assert gone_within([p.pid for p in children], 15), [p for p in children if process_alive(p.pid)]
