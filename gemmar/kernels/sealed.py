"""The package's own versions of the kernel parts that the notebooks' puzzles ask for (notebook 1
``tile_coords``, 2 ``push_partial``, 3 ``reduce_step``, 6 ``sum_partials``) and the host's copy of the tile
order, kept sealed: their text ships as encoded data (``sealed.dat``, next to this file) and is defined here,
once per process, on first use. The kernels run them like any of their functions; no file, docstring or
comment that a notebook leads to holds them, and in a notebook's own process ``??`` and ``inspect`` find no
source for them (docs/architecture.md, "The puzzles' answers"). Out of sight, not secret: decoding the data
on purpose shows them. ``show_source`` shows one once its puzzle's check has said right.

The readable text is ``instructors/package_parts.py``; after editing it, seal it again with
``python -m gemmar.kernels.sealed instructors/package_parts.py``.
"""

import ast
import base64
import linecache
import os
import sys
import textwrap
import zlib

NAMES = ("tile_coords", "push_partial", "reduce_step", "sum_partials", "host_tile_coords")
FILENAME = "<gemmar sealed parts>"   # the functions' file name (linecache), never a file on disk
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sealed.dat")

_defined = {}


def seal(text):
    """Text -> the encoded data (base64 of zlib), in lines of 100 characters."""
    return "\n".join(textwrap.wrap(base64.b64encode(zlib.compress(text.encode(), 9)).decode(), 100)) + "\n"


def unseal(data):
    return zlib.decompress(base64.b64decode("".join(data.split()))).decode()


def _text():
    with open(DATA) as f:
        return unseal(f.read())


def _define():
    if not _defined:
        text = _text()
        linecache.cache[FILENAME] = (len(text), None, text.splitlines(True), FILENAME)
        namespace = {"__name__": __name__}
        try:
            exec(compile(text, FILENAME, "exec"), namespace)   # (@triton.jit reads each function's source here)
        finally:
            if os.environ.get("TRITON_INTERPRET") != "1":
                # Compiled Triton keeps what it read; only the interpreter (the cpu ranks) reads the source again
                # at every call. Elsewhere, a notebook's own process included, inspect finds no source.
                linecache.cache.pop(FILENAME, None)
        _defined.update((name, namespace[name]) for name in NAMES)
    return _defined


def __getattr__(name):
    # `from .sealed import tile_coords` (the kernels) and shipping's imports by (module, name) come here.
    if name in NAMES:
        return _define()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def source(name):
    """The source of one sealed function, its decorator and comments included (for ``show_source``, once
    its puzzle's check has said right)."""
    text = _text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(text.splitlines(True)[first - 1:node.end_lineno])
    raise KeyError(name)


def is_sealed(fn):
    """Whether ``fn`` (a @triton.jit function or a plain one) is one of these."""
    return getattr(getattr(fn, "fn", fn), "__module__", None) == __name__ and \
        getattr(getattr(fn, "fn", fn), "__code__", None) is not None and \
        getattr(fn, "fn", fn).__code__.co_filename == FILENAME


if __name__ == "__main__":
    # python -m gemmar.kernels.sealed instructors/package_parts.py: seal that text into sealed.dat.
    with open(sys.argv[1]) as f:
        sealed = seal(f.read())
    with open(DATA, "w") as f:
        f.write(sealed)
    print(f"sealed {sys.argv[1]} into {DATA}")
