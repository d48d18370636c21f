"""Where a rank's program is, asked from the client while it runs: the line a report names for a rank that never
ended (it may spin in a kernel on a flag nobody sets, or wait in a collective a peer never reached).

Each rank, while a program runs, has Python's ``faulthandler`` write its stack to a file of its own when it gets
``SIGUSR2``. faulthandler writes from its C signal handler, so a rank answers whether it runs Python (a kernel's
spin loop under the Triton interpreter is Python), sleeps or waits inside a C call (a gloo barrier). The client
sends the signal, reads the file and names the innermost frame in the program's own files (or the Iris package
it runs): ``context.py:758 (while self.atomic_add(lock_ptr, 0, ...) != 1:)``.
"""

import contextlib
import faulthandler
import linecache
import os
import re
import signal
import time

SIGNAL = signal.SIGUSR2
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


def stack_file(store_path, rank):
    """The file rank ``rank`` of the run that meets at ``store_path`` writes its stack into."""
    return f"{store_path}.where{rank}"


@contextlib.contextmanager
def answering(path):
    """On a rank, while a program runs: its stack goes to ``path`` on ``SIGUSR2``."""
    try:
        out = open(path, "w")
    except OSError:   # (no answer then: the report says less, nothing fails)
        yield
        return
    try:
        faulthandler.register(SIGNAL, file=out, all_threads=False, chain=False)
        yield
    finally:
        with contextlib.suppress(Exception):
            faulthandler.unregister(SIGNAL)
        out.close()
        with contextlib.suppress(OSError):
            os.remove(path)


def ask(pids_and_files, wanted, script=None, wait_s=0.5):
    """{rank: "file.py:line (code)"} for each rank in ``pids_and_files`` ({rank: (pid, stack file)}) that answers
    within ``wait_s``; ``wanted(filename)`` says which frames are the program's; where the innermost is not in
    ``script`` (the program run), the line of ``script`` that led there follows ("from prog.py:40")."""
    asked = {}
    for rank, (pid, path) in pids_and_files.items():
        with contextlib.suppress(OSError, TypeError):
            size = os.path.getsize(path)
            os.kill(pid, SIGNAL)
            asked[rank] = (path, size)
    places = {}
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank, (path, size) in list(asked.items()):
            place = _innermost(path, size, wanted, script)
            if place:
                places[rank] = place
                del asked[rank]
    return places


def _innermost(path, size, wanted, script):
    try:
        with open(path) as f:
            f.seek(size)
            text = f.read()
    except OSError:
        return None
    frames = [m for m in map(FRAME.match, text.splitlines()) if m and wanted(m["file"])]   # (most recent first)
    if not frames:
        return None
    place = _place(frames[0], code=True)
    caller = next((m for m in frames if script and os.path.realpath(m["file"]) == os.path.realpath(script)), None)
    return place + (f", from {_place(caller, code=False)}" if caller is not None and caller is not frames[0] else "")


def _place(frame, code):
    text = linecache.getline(frame["file"], int(frame["line"])).strip() if code else ""
    return f"{os.path.basename(frame['file'])}:{frame['line']}" + (f" ({text})" if text else "")
