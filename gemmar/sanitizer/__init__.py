"""A race and bounds sanitizer for kernels on CPU ranks (``sanitize=True``, ``--sanitize``).

Under the Triton interpreter every access a kernel makes to the symmetric heap - through gemmar's device
API, Iris's, or a plain ``tl.load``/``tl.store``/atomic on a heap address - is recorded per rank, program
and line, numbered in the one order the memory saw them (``record.py``). Accesses outside the buffer they
address stop the run before they happen (:class:`~gemmar.errors.HeapBoundsError`). After the run, the
ranks' records meet at the client, and ``order.py`` finds every pair of accesses that nothing orders
(happens-before across ranks and programs): a race, even one that gave the right sum this time. The host's
own writes to a heap (``zero_``, ``copy_``, ``heap.zeros``, Iris's ``shmem.zeros``) are recorded too, as byte
ranges, while recording only (a torch dispatch mode on the recording thread).

What it proves, and what not: see docs/sanitizer.md.
"""

import contextlib
import os

from ..errors import UsageError
from . import record
from .order import Race, SanitizerReport, analyse

__all__ = ["Race", "SanitizerReport", "analyse", "recording", "start", "stop"]

SYNC_FILE = "sanitizer-order"   # in the cluster's private heap folder: the lock and counter all ranks share


def start(heap):
    """Record this rank's heap accesses from now on (cpu backend only)."""
    if heap.backend != "cpu":
        raise UsageError(f"sanitize=True is not allowed on the {heap.backend} backend: the sanitizer watches "
                         f"kernels under the Triton interpreter, so use backend='cpu'")
    if record.ACTIVE is not None:
        raise UsageError("sanitize=True: this rank is already recording (one sanitized run at a time)")
    record.install()
    record.ACTIVE = record.Recorder(heap, os.path.join(heap.folder, SYNC_FILE))
    record.watch_host_writes()


def stop():
    """Stop recording; this rank's record (for :func:`analyse`), or None when nothing was recording."""
    recorder, record.ACTIVE = record.ACTIVE, None
    if recorder is None:
        return None
    record.unwatch_host_writes()
    try:
        return recorder.take()
    finally:
        recorder.close()


@contextlib.contextmanager
def recording(heap, enabled=True):
    """``with recording(heap) as records:`` - after the block, ``records`` holds this rank's record."""
    records = []
    if not enabled:
        yield records
        return
    start(heap)
    try:
        yield records
    finally:
        records.append(stop())


def host_event(kind, **details):
    """A host-side ordering event on this rank, when recording: ``join`` (a stream waits for another stream or
    an event), ``record`` (an event on a stream), ``sync`` (the host waits for its streams, a stream or an
    event), ``arrive`` and ``leave`` (the host enters and leaves a collective of several ranks, ``meeting``: the
    same key on each). ``order.py`` says how each orders kernels."""
    if record.ACTIVE is not None:
        record.ACTIVE.host(kind, **details)


_NOT_RECORDING = contextlib.nullcontext()


def on_stream(name):
    """Kernels called inside run on stream ``name`` ("main" or "side"), as far as the sanitizer knows. (Called
    for every kernel launched: when nothing records, one shared do-nothing context, no generator.)"""
    return _NOT_RECORDING if record.ACTIVE is None else _recorded_stream(record.ACTIVE, name)


@contextlib.contextmanager
def _recorded_stream(recorder, name):
    before, recorder.stream = recorder.stream, name
    try:
        yield
    finally:
        recorder.stream = before
