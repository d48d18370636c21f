"""A shared workshop server: another local user ("bob") can neither read, forge into, nor block a cluster.

Bob is a real second user, made by the test (so it runs as root, as CI does; skipped with the reason
otherwise), whose attack runs in a process of his own: he connects to every TCP listener on 127.0.0.1 (as
`ss -ltn` shows them to anyone), subscribes to everything and pushes forged messages, while the cluster's
owner runs. The same attack against a plain ipyparallel cluster (no CurveZMQ) hears its traffic: the
attack is real, and what stops it is gemmar's.
"""

import contextlib
import dataclasses
import json
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap

import pytest
import torch

import gemmar
from gemmar.errors import ClusterError, RankDiedError
from gemmar.runtime import reaper
from gemmar.runtime.heap.cpu import CpuHeap, check_private_folder, open_checked, remove_arenas

BOB = "gemmarbob"
BOB_PYTHON = "/usr/bin/python3"   # (this test's Python may sit in a folder only its owner can enter)

# Bob's attack, in plain Python (bob has no pyzmq: ZMTP 3.0 spoken by hand, the NULL mechanism, as any zmq
# socket without keys would): every 127.0.0.1 listener, read as a SUB subscribed to everything, and written as
# PUB, DEALER and PUSH sockets (forged frames in ipyparallel's message layout, unsigned), for a few seconds.
ATTACK = textwrap.dedent('''
    import json, socket, struct, sys, time

    def listeners():
        ports = set()
        for line in open("/proc/net/tcp").readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port = local.split(":")
            if state == "0A" and address == "0100007F":
                ports.add(int(port, 16))
        return sorted(ports)

    def frame(body, more=False, command=False):
        flags = (1 if more else 0) | (4 if command else 0) | (2 if len(body) > 255 else 0)
        size = struct.pack(">Q", len(body)) if len(body) > 255 else bytes([len(body)])
        return bytes([flags]) + size + body

    def read_frame(sock):
        flags = sock.recv(1)
        if not flags:
            raise ConnectionError("closed")
        long = flags[0] & 2
        head = sock.recv(8 if long else 1, socket.MSG_WAITALL)
        size = struct.unpack(">Q", head)[0] if long else head[0]
        body = sock.recv(size, socket.MSG_WAITALL) if size else b""
        return flags[0], body

    def connect(port, kind):
        """A zmq peer of type ``kind`` with the NULL mechanism; None if the listener wants another one."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=1.0)
        greeting = b"\\xff" + b"\\0" * 8 + b"\\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\\0") + b"\\0" * 32
        sock.sendall(greeting)
        theirs = sock.recv(64, socket.MSG_WAITALL)
        if len(theirs) < 64 or theirs[12:32].rstrip(b"\\0") != b"NULL":
            sock.close()
            return None, theirs[12:32].rstrip(b"\\0").decode() if len(theirs) == 64 else "closed on him"
        ready = b"\\x05READY" + b"\\x0bSocket-Type" + struct.pack(">I", len(kind)) + kind.encode()
        sock.sendall(frame(ready, command=True))
        read_frame(sock)   # their READY
        if kind == "SUB":
            sock.sendall(frame(b"\\x01"))   # subscribe to everything (ZMTP 3.0)
        return sock, "NULL"

    seconds = float(sys.argv[1])
    ports = listeners()
    readers, writers, mechanisms = [], [], {}
    for port in ports:
        for kind in ("SUB", "PUB", "DEALER", "PUSH"):
            try:
                sock, mechanism = connect(port, kind)
            except OSError as e:
                mechanism, sock = type(e).__name__, None
            mechanisms[mechanism] = mechanisms.get(mechanism, 0) + 1
            if sock is not None:
                (readers if kind == "SUB" else writers).append(sock)
    header = json.dumps({"msg_type": "status", "msg_id": "x", "session": "x", "username": "bob",
                         "date": "2026-12-04T00:00:00Z", "version": "5.3"}).encode()
    forged = [b"<IDS|MSG>", b"0" * 64, header, b"{}", b"{}", json.dumps({"execution_state": "idle"}).encode()]
    message = b"".join(frame(part, more=i < len(forged) - 1) for i, part in enumerate(forged))
    received, sent, texts = 0, 0, []
    for sock in readers:
        sock.settimeout(0.02)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for sock in list(writers):
            try:
                sock.sendall(message)
                sent += 1
            except OSError:
                writers.remove(sock)
        for sock in list(readers):
            try:
                flags, body = read_frame(sock)
                received += 1
                texts.append(body[:400].decode("latin-1"))
            except socket.timeout:
                pass
            except OSError:
                readers.remove(sock)
        time.sleep(0.01)
    # What he understood: frames of ipyparallel's messages (a header names its msg_type), and alice's output.
    messages = [text for text in texts if '"msg_type"' in text]
    print(json.dumps({"ports": len(ports), "mechanisms": mechanisms, "received": received, "sent": sent,
                      "messages": len(messages), "secret_lines": sum("alice's secret line" in t for t in texts),
                      "sample": messages[:3]}))
''')

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="needs root, to make a second local user (bob) to attack from")


@pytest.fixture(scope="module")
def bob():
    """A second local user (made here, removed at the end), who can run the system's Python."""
    if not os.access(BOB_PYTHON, os.X_OK):
        pytest.skip(f"no {BOB_PYTHON} for the second user to attack with")
    made = subprocess.run(["useradd", "--no-create-home", "--system", "--shell", "/usr/sbin/nologin", BOB],
                          capture_output=True).returncode == 0
    try:
        user = pwd.getpwnam(BOB)
        probe = as_user(user, [BOB_PYTHON, "-c", "print(1)"])
        if probe.returncode:
            pytest.skip(f"user {BOB} cannot run {BOB_PYTHON}: {probe.stderr.strip()[-200:]}")
        yield user
    finally:
        if made:
            subprocess.run(["userdel", BOB], capture_output=True)


def as_user(user, command, timeout=120):
    def become():
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(command, preexec_fn=become, env=env, cwd="/", capture_output=True, text=True,
                          timeout=timeout)


def attack(user, seconds):
    import threading

    result = {}

    def run():
        p = as_user(user, [BOB_PYTHON, "-c", ATTACK, str(seconds)])
        result.update(json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-2000:]})

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_bob_hears_nothing_and_changes_nothing(bob, clusters):
    """While alice benches (progress reported per iteration), bob reads every listener and forges into all
    of them: he receives nothing, and alice's run is right, with all its progress, and so is the next one."""
    progress = []
    cluster = clusters(2)
    config = gemmar.RunConfig(algorithm="two_shot", m=64, n=64, k=64, BLK_M=32, BLK_N=32, BLK_K=32,
                              num_sms=2, world_size=2, iterations=12)
    thread, said = attack(bob, 5.0)
    result = cluster.bench(config, on_progress=lambda rank, data: progress.append((rank, data["iteration"])))
    thread.join()
    assert "error" not in said, said
    # He found the listeners, and none let a peer without the controller's key finish a handshake: he
    # read nothing and wrote nothing.
    assert said["ports"] > 0 and "NULL" not in said["mechanisms"], said
    assert said["received"] == 0 and said["sent"] == 0, said
    assert result.ok and len(progress) == 2 * 12, (result, progress)
    again = cluster.bench(dataclasses.replace(config, iterations=2))
    assert again.ok


def test_the_same_attack_hears_a_plain_ipyparallel_cluster(bob):
    """The control: without CurveZMQ (ipyparallel's default, gemmar's before), bob reads the traffic."""
    import ipyparallel as ipp

    folder = tempfile.mkdtemp(prefix="gemmar-test-plain-ipp-")
    os.chmod(folder, 0o700)
    cluster = ipp.Cluster(n=1, log_level=logging.ERROR, profile_dir=folder, shutdown_atexit=False)
    try:
        cluster.start_controller_sync(environment={"IPYTHONDIR": folder})
        cluster.start_engines_sync(1, environment={"IPYTHONDIR": folder})
        client = cluster.connect_client_sync(ipython_dir=folder)
        client.wait_for_engines(1, timeout=60)
        thread, said = attack(bob, 3.0)
        import time

        # Alice works for as long as bob listens: he first connects to every listener of the machine (with
        # other clusters running, hundreds), then reads for 3 s. (His forged messages may break this client
        # meanwhile; what counts here is what he read.)
        while thread.is_alive():
            client[:].execute("for i in range(5): print(\"alice's secret line\", i, flush=True)", block=False)
            time.sleep(0.2)
        thread.join()
        client.close()
        assert said.get("mechanisms", {}).get("NULL", 0) > 0 and said["received"] > 0, said
        # Among what he received are ipyparallel's messages themselves (headers, and often alice's output).
        assert said["messages"] > 0, said
    finally:
        cluster.stop_cluster_sync()
        shutil.rmtree(folder, ignore_errors=True)


def test_bob_cannot_reach_the_heaps_or_the_profile(bob):
    """The heap folder and the profile are 0700 with random names: bob cannot list them or create in them
    (so nothing of alice's can be squatted or swapped), and a stopped cluster leaves neither behind."""
    with gemmar.Cluster(world_size=2, backend="cpu") as cluster:
        heaps, profile = cluster.heap_folder, cluster.profile_dir
        probe = textwrap.dedent(f'''
            import os
            for folder in ({heaps!r}, {profile!r}):
                for what, act in (("list", lambda: os.listdir(folder)),
                                  ("create", lambda: open(os.path.join(folder, "rank1.tmp"), "x"))):
                    try:
                        act()
                        print(what, folder, "ALLOWED")
                    except PermissionError:
                        print(what, "refused")
        ''')
        p = as_user(bob, [BOB_PYTHON, "-c", probe])
        assert p.returncode == 0, p.stderr
        assert p.stdout.split("\n")[:4] == ["list refused", "create refused"] * 2, p.stdout
        assert cluster.gemm_all_reduce(torch.ones(32, 32), torch.ones(32, 32), BLK_M=32, BLK_N=32, BLK_K=32).ok
    assert not os.path.exists(heaps) and not os.path.exists(profile)


@pytest.fixture
def foreign_file(bob, tmp_path):
    """A 0666 file of bob's, of a heap's size, in a folder of alice's (0700), named as rank 1's heap."""
    folder = tmp_path / "heaps"
    folder.mkdir(mode=0o700)
    path = folder / "rank1"
    with open(path, "wb") as f:
        f.truncate(1 << 16)
    os.chown(path, bob.pw_uid, bob.pw_gid)
    os.chmod(path, 0o666)
    return path


def test_a_foreign_heap_file_is_refused_in_one_line_and_never_mapped(foreign_file):
    with pytest.raises(ClusterError) as caught:
        open_checked(str(foreign_file), 1 << 16, 0, 1)
    assert str(caught.value) == (f"rank 0: {foreign_file} is not rank 1's heap (owned by uid "
                                 f"{pwd.getpwnam(BOB).pw_uid}, not 0): refused, not mapped")
    os.chown(foreign_file, 0, 0)
    with pytest.raises(ClusterError, match=r"mode -rw-rw-rw-: others may use it\): refused"):
        open_checked(str(foreign_file), 1 << 16, 0, 1)
    os.chmod(foreign_file, 0o600)
    with pytest.raises(ClusterError, match=r"65536 bytes, not 4096\): refused"):
        open_checked(str(foreign_file), 4096, 0, 1)
    os.unlink(foreign_file)
    os.symlink("/etc/passwd", foreign_file)
    with open(foreign_file.parent / "rank0", "wb") as f:   # rank 0's own heap is right
        f.truncate(4096)
    os.chmod(foreign_file.parent / "rank0", 0o600)
    with pytest.raises(ClusterError, match=r"is not rank 1's heap \(.*\): refused, not mapped"):
        CpuHeap._map_all(0, 2, 4096, [str(foreign_file.parent / "rank0"), str(foreign_file)], 1.0)
    os.chmod(foreign_file.parent, 0o777)
    with pytest.raises(ClusterError, match=r"is not this cluster's private heap folder \(owner uid 0, mode "
                                           r"drwxrwxrwx\): refused"):
        check_private_folder(str(foreign_file.parent), 0)


def test_cleanup_skips_what_is_not_ours_and_always_ends(foreign_file, tmp_path):
    """The reaper and stop() remove what this user owns, skip bob's file (even as root, who could remove
    it), and go on to every folder they were given."""
    public = tmp_path / "public"
    public.mkdir(mode=0o1777)
    planted = public / "gemmar-x-rank0"
    os.rename(foreign_file, planted)
    mine = public / "gemmar-x-rank1"
    mine.write_text("")
    profile = tmp_path / "profile"
    (profile / "security").mkdir(parents=True)
    reaper.end_cluster(set(), [str(public / "gemmar-x-rank*")], [str(profile)])
    assert planted.exists() and not mine.exists() and not profile.exists()
    heaps = tmp_path / "heaps2"
    heaps.mkdir(mode=0o700)
    (heaps / "rank0").write_text("")
    assert remove_arenas(str(heaps)) == ["rank0"] and not heaps.exists()
    with contextlib.suppress(FileNotFoundError):
        planted.unlink()


def test_no_progress_heard_is_not_a_dead_rank(capfd, clusters):
    """A rank whose launches finish but whose progress never reaches the client (the client's channel
    failed) is not called dead: the client reads its progress file, says what failed, and the run ends
    normally. A rank that truly reports nothing still is stopped at the deadline."""
    from rank_helpers import finishing_quietly, silent

    cluster = clusters(2)
    assert cluster.run(finishing_quietly, 4.0, launch_deadline_s=1.5, timeout=60) == ["done", "done"]
    assert "the client's channel failed, not the rank" in capfd.readouterr().err
    for name in os.listdir(cluster.heap_folder):
        if name.startswith("progress-"):
            os.unlink(os.path.join(cluster.heap_folder, name))
    with pytest.raises(RankDiedError, match="finished no launch for 1.5 s"):
        cluster.run(silent, 4.0, launch_deadline_s=1.5, timeout=60)
