"""A rank whose program has ended can no longer arrive at a barrier: in ``gemmar run`` the ranks still waiting
for it are told, so that their wait ends within a second in one line, not at ``--timeout``.

The client (``runner.py``) sees every rank's program end, however it ends (it returns, ``sys.exit``,
``os._exit``, a signal), within its 50 ms poll, and writes the ranks that have ended to a file beside the
run's torch.distributed store, in the cluster's private folder (:func:`tell_ranks`: one line per rank: when,
which, how). On each rank, while its program runs, a thread reads that file every ``POLL_S``
(:func:`watching`):

- gemmar's heap barrier (``shmem.barrier``, and the collective calls of gemmar's ``iris`` that meet through
  it), on cpu ranks: the thread writes the barrier's watchdog, which the waiting kernel polls, so the wait
  ends at once; unless the barrier had completed after all, the host raises :class:`RankLeftError`
  (``SymmetricHeap.check_barrier``). That rank's barrier count is then out of step with the others': it leaves
  a mark here, and the client starts fresh ranks for the next program. On GPUs the heap barrier still ends
  at its watchdog (the host cannot write the watchdog under a running kernel there);
- torch.distributed's barrier (gloo): gloo fails by itself as soon as a peer's process group is gone (a
  program's end closes it, a dead process's sockets close); ``launch.py``'s ``dist.barrier`` names the rank
  that left (:func:`who_left`).

Ranks that ended because a rank had left are not listed: the line always names the rank that left first.
A rank that ends with a code of its own while the others run on is listed too: a barrier that still needs
it can no longer complete, but work that does not, goes on.
"""

import contextlib
import os
import re
import threading
import time

POLL_S = 0.1


def ended_path(store_path):
    return f"{store_path}.ended"


def _out_of_step_path(store_path, rank):
    return f"{store_path}.out_of_step.{rank}"


# -- the client ---------------------------------------------------------------------------------------------
def how_it_ended(exit_code, error):
    """'exit code 0', 'exit code 4', 'killed by SIGSEGV' (``error``: the runner's line for the rank, or None)."""
    found = re.search(r"killed by (SIG[A-Z0-9]+)", error or "")
    if found:
        return f"killed by {found.group(1)}"
    found = re.search(r" exited with code (\d+)", error or "")   # a program's os._exit(N): the process's own code
    return f"exit code {found.group(1) if found else exit_code}"


def tell_ranks(store_path, ended):
    """Write the ranks that have ended, ``ended``: [(ended_at, rank, how)], for the ranks still running."""
    text = "".join(f"{at!r}\t{rank}\t{how}\n" for at, rank, how in sorted(ended))
    path = ended_path(store_path)
    with open(f"{path}.new", "w") as f:
        f.write(text)
    os.replace(f"{path}.new", path)   # (a rank reads the whole list or the one before, never half of one)


def out_of_step(store_path, world_size):
    """The ranks whose heap barrier gave up during the run (each left a mark): fresh ranks next time."""
    return [r for r in range(world_size) if os.path.exists(_out_of_step_path(store_path, r))]


def forget(store_path, world_size):
    for path in [ended_path(store_path), f"{ended_path(store_path)}.new"] + \
            [_out_of_step_path(store_path, r) for r in range(world_size)]:
        with contextlib.suppress(OSError):
            os.remove(path)


# -- a rank -------------------------------------------------------------------------------------------------
def ended_ranks(store_path, me):
    """[(ended_at, rank, how)] of the ranks other than ``me`` that the client has seen end, first first."""
    try:
        with open(ended_path(store_path)) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    ended = []
    for line in lines:
        at, rank, how = line.split("\t", 2)
        if int(rank) != me:
            ended.append((float(at), int(rank), how))
    return sorted(ended)


def left_text(ended):
    """'rank 1 ended (exit code 0)' for the first rank that ended, or None."""
    if not ended:
        return None
    _, rank, how = ended[0]
    return f"rank {rank} ended ({how})"


def who_left(store_path, me, wait_s=0.0):
    """:func:`left_text` of the ranks that have ended, waiting up to ``wait_s`` for the client to say (a rank
    whose gloo barrier failed may learn it before the client has seen the other rank end)."""
    deadline = time.monotonic() + wait_s
    while True:
        text = left_text(ended_ranks(store_path, me))
        if text or time.monotonic() >= deadline:
            return text
        time.sleep(POLL_S / 2)


@contextlib.contextmanager
def watching(store_path, rank, heap):
    """While a program runs on this rank: once the client says a rank has ended, this rank's heap barrier
    gives up (``heap.give_up_barrier``; now, or at its next barrier). On the way out the watchdog is cleared,
    and a barrier that gave up leaves its mark for the client."""
    stop = threading.Event()

    def watch():
        while not stop.wait(POLL_S):
            text = left_text(ended_ranks(store_path, rank))
            if text:
                heap.give_up_barrier(text)
                return

    thread = threading.Thread(target=watch, name="gemmar-departures", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if heap.forget_given_up_barrier():
            with contextlib.suppress(OSError):
                open(_out_of_step_path(store_path, rank), "w").close()
