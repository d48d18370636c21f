"""The package's own versions of the kernel parts that the notebooks' puzzles ask participants to write
(notebook 1 ``tile_coords``, 2 ``push_partial``, 3 ``reduce_step``, 6 ``sum_partials``), and the host's copy of
the tile order (``host_tile_coords``): what the kernels run when no participant's part is given.

Their text is the puzzles' answers, so it ships encoded (``puzzle_parts.dat``, next to this file: zlib, then
base64) and is defined here once per process, on first use, under a file name that is no file on disk. The
rule for when a participant may see them (not before their puzzle's check says right), and the instructors'
command that encodes ``instructors/package_parts.py`` into the data, are the teaching code's:
:mod:`gemmar.analysis.source`.
"""

import base64
import linecache
import os
import zlib

NAMES = ("tile_coords", "push_partial", "reduce_step", "sum_partials", "host_tile_coords")
FILENAME = "<gemmar puzzle parts>"   # the functions' file name (linecache), never a file on disk
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "puzzle_parts.dat")

_defined = {}


def decode(data):
    """The encoded data -> the text (base64 of zlib; line breaks ignored)."""
    return zlib.decompress(base64.b64decode("".join(data.split()))).decode()


def text():
    """The parts' text, decoded from ``puzzle_parts.dat``."""
    with open(DATA) as f:
        return decode(f.read())


def _define():
    if not _defined:
        source = text()
        linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
        namespace = {"__name__": __name__}
        try:
            exec(compile(source, FILENAME, "exec"), namespace)   # (@triton.jit reads each function's source here)
        finally:
            if os.environ.get("TRITON_INTERPRET") != "1":
                # Compiled Triton keeps what it read; only the interpreter (the cpu ranks) reads the source again
                # at every call. Elsewhere, a notebook's own process included, inspect finds no source.
                linecache.cache.pop(FILENAME, None)
        _defined.update((name, namespace[name]) for name in NAMES)
    return _defined


def __getattr__(name):
    # `from .puzzle_parts import tile_coords` (the kernels) and shipping's imports by (module, name) come here.
    if name in NAMES:
        return _define()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_one(fn):
    """Whether ``fn`` (a @triton.jit function or a plain one) is one of these parts."""
    plain = getattr(fn, "fn", fn)
    return getattr(plain, "__module__", None) == __name__ and getattr(plain, "__code__", None) is not None and \
        plain.__code__.co_filename == FILENAME
