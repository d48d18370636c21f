"""The watchdog record a wait that expired writes (``device.wait_at_least``), and how the host reads it.

The record is WATCHDOG_WORDS int64 words in the caller's own heap: the first wait of a launch that expired, with
its rank, tile, flag (kind and index), the value waited for and the value seen, its program, and the address it
polled, so that a wait given a wrong address is reported by the flag it really waited on. Under the interpreter
the kernel line of the wait is kept too (EXPIRED_WAIT_LINES), for the report: the line that called the wait.
"""

WATCHDOG_WORDS = 9

# Under the interpreter, (file, line, function) of each expired wait's kernel line, by the address of the
# watchdog record it was reported in; the host takes it when it reads the record.
EXPIRED_WAIT_LINES = {}


def read_watchdog(words, wait_flags):
    """A watchdog record (WATCHDOG_WORDS int64s, host side) -> a dict for DeadlockError, or None when nothing
    expired. ``wait_flags``: the waiting kernel's flag names -> ids. ``address``: the address polled (the heap
    says which buffer and element it is)."""
    words = [int(x) for x in words]
    if words[0] == 0:
        return None
    names = {flag_id: name for name, flag_id in wait_flags.items()}
    return dict(rank=words[1], tile=words[2], flag=names.get(words[3], f"flag {words[3]}"), index=words[4],
                expected=words[5], seen=words[6], program=words[7], address=words[8])

