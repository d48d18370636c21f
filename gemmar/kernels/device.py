"""The device API: Triton functions that read, write and atomically update another rank's heap.

Every rank's symmetric heap holds the same buffers at the same offsets. A kernel on rank ``r`` that wants
the copy of a buffer that lives on rank ``q`` takes its own pointer, subtracts its own heap base and adds
rank ``q``'s base, as seen from this process: ``heap_bases[q]``. That is :func:`translate`; every other
function here is a Triton memory operation applied to a translated pointer.

The argument order follows Iris, so a kernel written against this module ports to Iris by changing one
import. ``ptr`` is always an address in the calling rank's own heap; data flows *from* ``from_rank``
*to* ``to_rank``:

- ``load(ptr, to_rank, from_rank, heap_bases)``: the caller (``to_rank``) reads ``from_rank``'s copy.
- ``get(from_ptr, to_ptr, from_rank, to_rank, heap_bases)``: the caller (``from_rank``) reads ``to_rank``'s copy
  of ``from_ptr`` into its own ``to_ptr`` (Iris's roles: the pointer always travels from ``from_rank`` to
  ``to_rank``).
- ``store(ptr, value, from_rank, to_rank, heap_bases)``: the caller (``from_rank``) writes ``to_rank``'s copy.
- ``atomic_*(ptr, value, from_rank, to_rank, heap_bases, mask=, sem=, scope=)``: the caller updates
  ``to_rank``'s copy and gets the old value back.

``sem`` is one of ``"relaxed"``, ``"acquire"``, ``"release"``, ``"acq_rel"``; ``scope`` one of ``"cta"``,
``"gpu"``, ``"sys"``. Across ranks use ``scope="sys"``: the peer is another device (or process).

Under the Triton interpreter (``TRITON_INTERPRET=1``, the cpu backend) the same source runs as Python
over numpy; the heaps are shared-memory mappings, so a translated pointer is a real address in this
process and the atomics are real atomics across processes. Two things differ there and are chosen by the
constexpr ``INTERPRETER``: the clock (:func:`now`) and a short sleep while spinning, so that waiting ranks
leave the cores to the ranks they wait for.
"""

import functools
import linecache
import os
import sys
import time

import triton
import triton.language as tl

from ..errors import HeapBoundsError
from .watchdog import EXPIRED_WAIT_LINES, WATCHDOG_WORDS, read_watchdog  # noqa: F401 (the record, read by the host)

# Read once, when gemmar is imported, exactly as Triton itself decides at decoration time.
INTERPRETER = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


def _is_rocm():
    try:
        import torch

        return torch.version.hip is not None
    except Exception:  # pragma: no cover - torch is a hard dependency
        return False


# Which hardware timer now() reads when compiled: NVIDIA %globaltimer (ns) or AMD s_memrealtime.
AMD_TIMER = tl.constexpr(_is_rocm())

# How long a spinning program sleeps between polls under the interpreter (seconds).
INTERPRETER_POLL_S = 50e-6


def _host_clock_ns():
    # CLOCK_MONOTONIC is one clock for every process on the machine, so events of all ranks line up.
    return tl.full((), time.monotonic_ns(), tl.int64)


def _host_pause():
    time.sleep(INTERPRETER_POLL_S)


# Marking these as builtins lets @triton.jit code name them. They are only ever reached inside an
# `if INTERPRETER:` branch, which the compiler never visits when it compiles for a GPU.
_host_clock_ns.__triton_builtin__ = True
_host_pause.__triton_builtin__ = True

_TRITON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(triton.__file__)))
_GEMMAR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames in these files are the device API, not the kernel: a report names the line that called them. The
# package's own puzzle parts too (kernels/puzzle_parts.py's FILENAME): a report names the line that calls the part.
PASS_THROUGH = (os.path.join(_TRITON_DIR, "triton") + os.sep, os.path.join(_GEMMAR_DIR, "sanitizer") + os.sep,
                os.path.join(_GEMMAR_DIR, "kernels", "device.py"), "<gemmar puzzle parts>",
                os.path.join(_GEMMAR_DIR, "kernels", "triton_support.py"))   # (an aggregate's bound jit methods)
# A layer above the kit whose module is a device API of its own (gemmar's Iris layer: iris.device, its tiles)
# sets this name true in the module: reports pass through its frames too, and the kit names no file of it.
DEVICE_API_MODULE = "REPORTS_NAME_THE_LINE_THAT_CALLS_THIS_MODULE"


def passes_through(frame):
    return frame.f_code.co_filename.startswith(PASS_THROUGH) or frame.f_globals.get(DEVICE_API_MODULE, False)


def place(where):
    """Where a report points: ``file.py:line``, or for shipped user code (``<gemmar ...>``) its line's text."""
    file, line, function = where
    if file.startswith("<gemmar "):
        text = linecache.getline(file, line).strip()
        return f"`{text}` ({function})" if text else f"line {line} of {function}"
    return f"{os.path.basename(file)}:{line}"


@functools.lru_cache(maxsize=None)
def library_folders(*more):
    """The folders whose files are libraries rather than a user's program (the standard library, site-packages,
    gemmar itself, and ``more``), each ending in the path separator: what the sanitizer's host lines and a hosted
    program's file list pass over."""
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(p) + os.sep for p in {paths["stdlib"], paths["purelib"], paths["platlib"],
                                                         _GEMMAR_DIR, *more})


def kernel_line():
    """(file, line, function) of the innermost frame that is the kernel's own code, not the device API (for the
    one-line reports of translate's rank check here and of the sanitizer)."""
    frame = sys._getframe(2)
    while frame is not None and passes_through(frame):
        frame = frame.f_back
    if frame is None:
        return ("?", 0, "?")
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


# Under the interpreter, every heap_bases table of this process that kernels are given: (address of its first
# entry, caller's rank, world size). A rank outside the world would read past the table and translate to an
# address that kills the process with SIGSEGV; translate() checks first and says so in one line (the words of
# the sanitizer's own check, sanitizer/record.py, which sees only gemmar's own heap_bases).
BASES_TABLES = []


def register_heap_bases(address, rank, world_size):
    """Tell translate() under the interpreter that ``world_size`` heap bases start at ``address``; returns a
    function that forgets them (the table's memory may be reused once it is gone)."""
    entry = (int(address), rank, world_size)
    BASES_TABLES.append(entry)
    return lambda: entry in BASES_TABLES and BASES_TABLES.remove(entry)


def _value(x):
    handle = getattr(x, "handle", None)
    return getattr(handle, "data", getattr(x, "value", x))


def host_int(x):
    """A scalar of an interpreted kernel (a tensor, a constexpr or an int) as a Python int."""
    import numpy as np

    return int(np.asarray(_value(x)).reshape(-1)[0])


def _check_ranks(heap_bases, from_rank, to_rank):
    import numpy as np

    address = int(np.asarray(_value(heap_bases)).reshape(-1)[0])
    for start, rank, world_size in BASES_TABLES:
        if start <= address < start + 8 * world_size:
            first = (address - start) // 8
            for asked in (from_rank, to_rank):
                ranks = np.asarray(_value(asked)).reshape(-1) + first
                bad = ranks[(ranks < 0) | (ranks >= world_size)]
                if bad.size:
                    from triton.runtime.interpreter import interpreter_builder

                    where = place(kernel_line())
                    x, y, z = interpreter_builder.grid_idx
                    gx, gy, _ = interpreter_builder.grid_dim
                    raise HeapBoundsError(
                        f"rank {rank}, program {x + gx * (y + gy * z)} asked for rank {int(bad[0])} at "
                        f"{where}: ranks are 0 to {world_size - 1} (world_size={world_size})")
            return


_check_ranks.__triton_builtin__ = True


@triton.jit
def now():
    """A timestamp in nanoseconds, comparable across all ranks of one machine."""
    if INTERPRETER:
        t = _host_clock_ns()
    elif AMD_TIMER:
        # s_memrealtime counts a constant 100 MHz clock; scale to ns. Untested: no AMD GPU here.
        t = tl.inline_asm_elementwise("s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                      is_pure=False, pack=1) * 10
    else:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                      pack=1)
    return t


@triton.jit
def pause():
    """Called once per poll of a spin-wait. Under the interpreter: give the core to the other ranks. On an
    NVIDIA GPU: sleep a quarter of a microsecond, so that waiting programs do not flood the memory system
    that the programs they wait for are using."""
    if INTERPRETER:
        _host_pause()
    elif not AMD_TIMER:
        tl.inline_asm_elementwise("nanosleep.u32 256;\nmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases):
    """``ptr`` as an address in ``from_rank``'s heap -> the same offset in ``to_rank``'s heap.

    The shift is one scalar (the distance between the two heaps, in elements) added to ``ptr``. Adding a
    scalar keeps what the compiler knows about ``ptr`` (which elements are contiguous), so a tile still
    moves in 16-byte vector loads and stores; rebuilding every address from integers would lose that and
    turn a remote tile store into thousands of 4-byte writes over NVLink. Heaps start on 256-byte
    boundaries (checked when the heap is made), so the distance is a multiple of 16 bytes.
    Under the interpreter a rank outside the world is refused first (:func:`_check_ranks`), one line naming it.
    """
    if INTERPRETER:
        _check_ranks(heap_bases, from_rank, to_rank)
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    ELEMENT_BYTES: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    shift = tl.multiple_of((to_base - from_base) // ELEMENT_BYTES, 16 // ELEMENT_BYTES)
    return ptr + shift


@triton.jit
def with_hint(ptr, hint: tl.constexpr = None):
    """Iris's ``hint=``: tell the compiler that runs of ``hint`` addresses of ``ptr`` are contiguous and aligned
    (an int, or a tuple per dimension), so a translated tile still moves in wide vector accesses."""
    if hint is not None:
        ptr = tl.max_contiguous(tl.multiple_of(ptr, hint), hint)
    return ptr


@triton.jit
def load(ptr, to_rank, from_rank, heap_bases, mask=None, other=None, cache_modifier=None, volatile=False,
         hint: tl.constexpr = None):
    """The caller (``to_rank``) reads ``from_rank``'s copy of ``ptr``."""
    return tl.load(with_hint(translate(ptr, to_rank, from_rank, heap_bases), hint), mask=mask, other=other,
                   cache_modifier=cache_modifier, volatile=volatile)


@triton.jit
def store(ptr, value, from_rank, to_rank, heap_bases, mask=None, hint: tl.constexpr = None, cache_modifier=None):
    """The caller (``from_rank``) writes ``value`` into ``to_rank``'s copy of ``ptr``."""
    tl.store(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
             cache_modifier=cache_modifier)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None, other=None,
         load_cache_modifier=None, store_cache_modifier=None, hint: tl.constexpr = None):
    """Copy ``from_rank``'s ``src_ptr`` data into ``to_rank``'s ``dst_ptr``; both pointers are addresses in
    the caller's (``cur_rank``) heap, and either rank may be the caller or a third rank."""
    data = tl.load(with_hint(translate(src_ptr, cur_rank, from_rank, heap_bases), hint), mask=mask, other=other,
                   cache_modifier=load_cache_modifier)
    tl.store(with_hint(translate(dst_ptr, cur_rank, to_rank, heap_bases), hint), data, mask=mask,
             cache_modifier=store_cache_modifier)


@triton.jit
def get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None, load_cache_modifier=None,
        store_cache_modifier=None, hint: tl.constexpr = None):
    """The caller (``from_rank``, in whose heap ``from_ptr`` is) reads ``to_rank``'s copy of ``from_ptr`` into its
    own local ``to_ptr``. These are Iris's roles as its code and its own tests use them (``iris.get(data, results,
    cur_rank, peer, heap_bases)`` pulls from ``peer``): the pointer is translated from ``from_rank`` to ``to_rank``,
    as in every other call here; only the store stays local."""
    data = tl.load(with_hint(translate(from_ptr, from_rank, to_rank, heap_bases), hint), mask=mask, other=other,
                   cache_modifier=load_cache_modifier)
    tl.store(to_ptr, data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None, load_cache_modifier=None,
        store_cache_modifier=None, hint: tl.constexpr = None):
    """Copy the caller's (``from_rank``) local ``from_ptr`` data into ``to_rank``'s ``to_ptr``."""
    copy(from_ptr, to_ptr, from_rank, to_rank, from_rank, heap_bases, mask, other, load_cache_modifier,
         store_cache_modifier, hint)


@triton.jit
def atomic_add(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr += value``; returns the old value."""
    return tl.atomic_add(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
                         sem=sem, scope=scope)


@triton.jit
def atomic_sub(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr -= value``; returns the old value."""
    return tl.atomic_add(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), -value, mask=mask, sem=sem,
                         scope=scope)


@triton.jit
def atomic_cas(ptr, compare, value, from_rank, to_rank, heap_bases, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr = value if *ptr == compare``; returns the old value."""
    return tl.atomic_cas(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), compare, value,
                         sem=sem, scope=scope)


@triton.jit
def atomic_xchg(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr = value``; returns the old value."""
    return tl.atomic_xchg(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
                          sem=sem, scope=scope)


@triton.jit
def atomic_min(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr = min(*ptr, value)``; returns the old value."""
    return tl.atomic_min(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
                         sem=sem, scope=scope)


@triton.jit
def atomic_max(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr = max(*ptr, value)``; returns the old value."""
    return tl.atomic_max(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
                         sem=sem, scope=scope)


@triton.jit
def atomic_and(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr &= value``; returns the old value."""
    return tl.atomic_and(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
                         sem=sem, scope=scope)


@triton.jit
def atomic_or(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr |= value``; returns the old value."""
    return tl.atomic_or(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
                        sem=sem, scope=scope)


@triton.jit
def atomic_xor(ptr, value, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
    """``to_rank``'s ``*ptr ^= value``; returns the old value."""
    return tl.atomic_xor(with_hint(translate(ptr, from_rank, to_rank, heap_bases), hint), value, mask=mask,
                         sem=sem, scope=scope)


# ---------------------------------------------------------------------------------------------------------
# Waiting on a flag, with a watchdog. Used by every wait of the kernels: the ring, two_shot, the standalone
# all-reduce and the barrier.
# ---------------------------------------------------------------------------------------------------------

# Each algorithm names the flags it waits on by the ids its kernels pass to wait_at_least as ``flag_kind``
# (``AlgorithmSpec.wait_flags``: name -> id), so that a DeadlockError says which flag, in its own words.

# Counters that several ranks update and others poll sit this many int32s apart: one 128-byte cache line
# each, so that an update of one never invalidates the line another program is polling.
FLAG_WORDS = 32                        # host side
FLAG_STRIDE = tl.constexpr(FLAG_WORDS)   # kernels


def note_expired_wait(watchdog):
    """Interpreter only: keep the kernel line of the wait that just wrote its expiry into ``watchdog``."""
    EXPIRED_WAIT_LINES[host_int(watchdog)] = kernel_line()


note_expired_wait.__triton_builtin__ = True


@triton.jit
def wait_at_least(flag, target, timeout_ns, watchdog, rank, tile_id, flag_kind, flag_index):
    """Spin until ``*flag >= target`` (acquire, system scope); give up after ``timeout_ns``.

    ``flag`` must be in the caller's own heap: peers signal into it, the caller polls it locally. The
    polls are plain volatile loads with a pause between them; only the read that ends the wait is an
    acquire. (Polling with acquire atomics slowed a GEMM running beside waiting programs several times over:
    every one of them orders memory system-wide; docs/decisions.md, polling.)
    Returns the value last seen. When the wait expires, the first expiry of this launch is written to
    ``watchdog`` (rank, tile, flag kind and index, target, seen) and the host raises DeadlockError.
    The watchdog must be zero before the launch (the launcher clears it only after reporting an expiry).
    """
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    if seen < target:
        start = now()
        # Once any wait of this launch on this rank has expired, the rest give up at once: the run is
        # lost anyway, and waiting out every timeout in turn would look like the hang it reports.
        expired = tl.load(watchdog, volatile=True) != 0
        while (seen < target) & (expired == 0):
            pause()
            seen = tl.load(flag, volatile=True)
            expired = ((now() - start) > timeout_ns) | (tl.load(watchdog, volatile=True) != 0)
        # The acquire that orders every later read of this program after the signaller's writes.
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
        if seen < target:
            # Only the first expired wait of a launch is reported; the rest follow from it.
            if tl.atomic_cas(watchdog, tl.cast(0, tl.int64), tl.cast(1, tl.int64), sem="relaxed", scope="gpu") == 0:
                tl.store(watchdog + 1, tl.cast(rank, tl.int64))
                tl.store(watchdog + 2, tl.cast(tile_id, tl.int64))
                tl.store(watchdog + 3, tl.cast(flag_kind, tl.int64))
                tl.store(watchdog + 4, tl.cast(flag_index, tl.int64))
                tl.store(watchdog + 5, tl.cast(target, tl.int64))
                tl.store(watchdog + 6, tl.cast(seen, tl.int64))
                tl.store(watchdog + 7, tl.cast(tl.program_id(0), tl.int64))
                tl.store(watchdog + 8, tl.cast(flag, tl.int64))
                if INTERPRETER:
                    note_expired_wait(watchdog)
    return seen


@triton.jit
def wait_for_tile(flag, target, timeout_ns, watchdog, rank, tile_id, FLAG_KIND: tl.constexpr):
    """:func:`wait_at_least` on tile ``tile_id``'s own flag, as a kernel part (ring's two waits, two_shot's
    ``partial_wait``): a teaching mistake swaps it (``kernels/mistakes.py``), no branch in the kernel does."""
    wait_at_least(flag, target, timeout_ns, watchdog, rank, tile_id, FLAG_KIND, tile_id)


@triton.jit
def signal(flag, value, from_rank, to_rank, heap_bases):
    """Publish ``value`` in ``to_rank``'s ``flag`` with release semantics.

    The block-wide barrier first makes every thread's earlier stores part of what the one signalling
    thread releases; without it the receiver could see the flag before the data.
    """
    tl.debug_barrier()
    atomic_xchg(flag, value, from_rank, to_rank, heap_bases, sem="release", scope="sys")
