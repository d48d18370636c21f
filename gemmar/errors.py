"""The errors gemmar raises on purpose. Each message is one line naming the bad value and what is allowed."""


class GemmarError(Exception):
    """Base class for every error gemmar raises on purpose."""

    def _render_traceback_(self):
        """What IPython (a notebook) shows for it: its one line, not a traceback through gemmar's code, which
        says nothing the line does not (the line names the bad value and what is allowed)."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class UsageError(GemmarError, ValueError):
    """Bad input: a shape, block size, dtype, algorithm, world size or file that gemmar cannot use."""


class DeadlockError(GemmarError):
    """A spin-wait in a kernel ran past its watchdog timeout.

    ``waits`` holds one dict per rank that timed out: rank, program, tile, flag name and index,
    the value the rank waited for and the value it last saw; ``waited_on``, the flag at the address the wait
    really polled when that is another (a wait given a wrong address), and ``line``, the kernel line of the wait
    (cpu ranks). The message is built from them.
    """

    def __init__(self, waits):
        self.waits = list(waits)
        super().__init__(self.describe(self.waits))

    @staticmethod
    def describe(waits):
        parts = []
        for w in waits:
            where = {"barrier": "at the barrier",
                     "results_in": f"for the tiles rank {w['index']} owns"}.get(w["flag"], f"on tile {w['tile']}")
            named = f"{w['flag']}[{w['index']}]"
            flag = (f"{w['waited_on']} (the address it polled; its wait names {named})" if w.get("waited_on")
                    else named)
            parts.append(f"rank {w['rank']} (program {w['program']}) waited {where} for flag {flag} >= "
                         f"{w['expected']} but saw {w['seen']}" + (f", at {w['line']}" if w.get("line") else ""))
        return "deadlock: " + "; ".join(parts)

    def __reduce__(self):  # travels between engine and client by pickle
        return DeadlockError, (self.waits,)


class HeapBoundsError(UsageError):
    """Sanitize mode: a kernel's access reaches outside the heap buffer it addresses, or asks for a rank that
    does not exist. Raised before the access runs; the message names rank, program, line and buffer."""


class RankDiedError(GemmarError):
    """An engine (rank) stopped answering or died during a run."""

    def __init__(self, message, ranks=()):
        super().__init__(message)
        self.ranks = list(ranks)


class ClusterError(GemmarError):
    """The cluster could not start, or is not running."""


class RankLeftError(GemmarError):
    """A barrier that can no longer complete: a rank it waits for has ended its program (``gemmar run``;
    ``gemmar/programs/departures.py``). The message names that rank and how it ended."""


def gemmar_cause(error):
    """The GemmarError that ``error`` wraps (the interpreter re-raises a kernel's exception as its own
    InterpreterError, once per @triton.jit call level), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, GemmarError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
