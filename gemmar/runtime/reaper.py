"""A cluster's reaper: a small process that ends the cluster's processes and removes its files once the
process that owns the cluster is gone, however it ended.

ipyparallel starts the controller and every engine in a session of its own (so that a Ctrl-C in a terminal
does not reach them). The price: nothing ends them when their owner dies. A client killed by SIGTERM or
SIGKILL, or a Jupyter kernel shut down, would leave a controller and idle engines running for good.

So the owner starts one reaper per cluster, in a session of its own too, and holds the only write end of
a pipe to the reaper's standard input. Through it the owner names what belongs to the cluster:

    session <sid>     every process of this session (a controller and its children, an engine, a nanny)
    tag <id>          every process whose environment has GEMMAR_CLUSTER=<id>: what the cluster's processes
                      started, inherited it, and left their session (setsid) or were re-parented to init
    glob <pattern>    files to remove
    tree <path>       a folder to remove (the cluster's private ipyparallel profile, its private heap folder)

Only what this user owns is removed; anything else in the way is skipped, so cleanup always ends.

The pipe reaches end-of-file when the owner closes it (``stop()``) or when the owner's process ends, for
any reason: the kernel closes a dead process's files. The reaper then kills every process still in those
sessions and removes the files. Should the reaper be killed first, each engine does the same on its own
once it sees the owner gone (``rank.watch_owner``). It is run as a file, not as a module of the package, so that it starts
in milliseconds and does not import torch.
"""

import glob
import os
import shutil
import sys

import psutil


TAG_VARIABLE = "GEMMAR_CLUSTER"   # set in the environment of every process a cluster starts


def processes_in(sessions, tags=()):
    """Processes (other than this one) whose session is one of ``sessions`` (orphans included, since a
    process keeps its session when its parent dies), or whose environment carries one of ``tags`` (a
    descendant that left the session with setsid() still has the environment it was started with)."""
    found, me, uid = [], os.getpid(), os.geteuid()
    for proc in psutil.process_iter():
        try:
            if proc.pid == me:
                continue
            if os.getsid(proc.pid) in sessions or (tags and proc.uids().real == uid
                                                   and proc.environ().get(TAG_VARIABLE) in tags):
                found.append(proc)
        except (OSError, psutil.Error):   # gone meanwhile, or not ours to look at
            continue
    # And their descendants, whatever their session and environment: an engine is the subreaper of what
    # it starts (processes.become_subreaper), so even a double-forked orphan is still in its tree now,
    # before it is killed (after, the orphan would go to init, out of reach).
    pids = {proc.pid for proc in found}
    for proc in list(found):
        try:
            below = proc.children(recursive=True)
        except psutil.Error:
            continue
        for child in below:
            if child.pid not in pids and child.pid != me:
                pids.add(child.pid)
                found.append(child)
    return found


def end_sessions(sessions, children_only=False, tags=()):
    """SIGKILL every process of ``sessions``; wait (5 s at most) until they are gone, or with
    ``children_only`` until this process's own children are (and reaped): the others' exits are the
    kernel's and their parents' business once SIGKILL is sent, and waiting for them can take a second."""
    procs = processes_in(sessions, tags)
    for proc in procs:
        _kill(proc)
    if children_only:
        procs = [proc for proc in procs if _parent(proc) == os.getpid()]
    psutil.wait_procs(procs, timeout=5)


def _kill(proc):
    try:
        proc.kill()
    except psutil.Error:
        pass


def _parent(proc):
    try:
        return proc.ppid()
    except psutil.Error:
        return None


def owned(path):
    """Whether ``path`` (not followed if a symlink) is this user's: what is not is never removed."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def remove_own(path):
    """Unlink ``path`` if it is this user's; anything else (gone, another user's) is skipped, never fatal."""
    if owned(path):
        try:
            os.unlink(path)
        except OSError:
            pass


def main():
    sessions, patterns, trees, tags = set(), [], [], set()
    for line in sys.stdin:   # until the owner closes the pipe or dies
        word, _, value = line.rstrip("\n").partition(" ")
        if word == "session":
            sessions.add(int(value))
        elif word == "tag":
            tags.add(value)
        elif word == "glob":
            patterns.append(value)
        elif word == "tree":
            trees.append(value)
    end_cluster(sessions, patterns, trees, tags)


def end_cluster(sessions, patterns, trees, tags=()):
    """Kill every process of the cluster's sessions (but this one), remove its files, and wait for them.
    The reaper does this when its pipe closes; each engine does it too when it sees that the owner is gone
    (the second line of defence: the reaper itself may have been killed)."""
    procs = processes_in(sessions, tags)
    for proc in procs:
        _kill(proc)
    for pattern in patterns:
        for path in glob.glob(pattern):
            remove_own(path)
    for tree in trees:
        if owned(tree):
            shutil.rmtree(tree, ignore_errors=True)
    psutil.wait_procs(procs, timeout=5)   # then stay until they are gone: a watcher can wait for the reaper


if __name__ == "__main__":
    main()
