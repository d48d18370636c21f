"""The code next to the picture: a package function's source, read from the package at run time (never a
copy in a notebook), so what a notebook shows is exactly what runs.

And the puzzles' reveal rule. The kernels run the package's own ``tile_coords``, ``push_partial``,
``reduce_step`` and ``sum_partials`` (:mod:`gemmar.kernels.puzzle_parts`), which are the answers of notebooks
1, 2, 3 and 6. So no route a notebook leads to shows them before their puzzle's check says right: their text
ships encoded, is known to ``inspect`` only where the Triton interpreter needs it (the cpu ranks), and
:func:`show_source` shows one only with its check's right verdict (docs/architecture.md, "The puzzles'
answers"). Their readable text is ``instructors/package_parts.py``; after editing it, encode it again with
``python -m gemmar.analysis.source instructors/package_parts.py``.
"""

import ast
import base64
import inspect
import sys
import textwrap
import zlib


def source(fn):
    """The source text of ``fn``: a plain function or a ``@triton.jit`` one (its decorator included)."""
    if is_answer(fn):   # (inspect finds no source for these in a notebook's process)
        return answer_source(getattr(fn, "fn", fn).__name__)
    return inspect.getsource(getattr(fn, "fn", fn))


def show_source(fn, once=None):
    """``fn``'s source as a highlighted code block in a notebook. ``once``: a puzzle check's verdict; the source
    (which holds the puzzle's answer) is shown only when that check said right!, and a note otherwise."""
    from IPython.display import Code, Markdown

    plain = getattr(fn, "fn", fn)
    name = getattr(plain, "__name__", "it")
    if is_answer(fn) and not getattr(once, "right", False):
        # A puzzle's answer (the package's own part) is shown only with its check's verdict, once right.
        return Markdown(f"*The package's own `{name}` is the answer to a puzzle: it is shown here once the puzzle's "
                        f"check says right! (pass the check's verdict: `show_source({name}, once=verdict)`).*")
    if once is not None and not getattr(once, "right", False):
        return Markdown(f"*The package's own `{name}` is shown here once the check above says right!: solve the "
                        f"puzzle, run the check, then this cell again.*")
    return Code(source(fn), language="python")


def is_answer(fn):
    """Whether ``fn`` is one of the package's answers to the notebooks' puzzles (its own puzzle parts)."""
    from ..kernels import puzzle_parts

    return puzzle_parts.is_one(fn)


def answer_source(name):
    """The source of one of the package's puzzle parts, its decorator and comments included (for
    :func:`show_source`, once its puzzle's check has said right)."""
    from ..kernels import puzzle_parts

    text = puzzle_parts.text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(text.splitlines(True)[first - 1:node.end_lineno])
    raise KeyError(name)


def encode(text):
    """Text -> the encoded data that ``puzzle_parts.decode`` reads (base64 of zlib), in lines of 100 characters."""
    return "\n".join(textwrap.wrap(base64.b64encode(zlib.compress(text.encode(), 9)).decode(), 100)) + "\n"


if __name__ == "__main__":
    # python -m gemmar.analysis.source instructors/package_parts.py: encode that text into puzzle_parts.dat.
    from ..kernels import puzzle_parts

    if len(sys.argv) != 2:
        sys.exit("usage: python -m gemmar.analysis.source instructors/package_parts.py (the parts' readable text)")
    with open(sys.argv[1]) as f:
        data = encode(f.read())
    with open(puzzle_parts.DATA, "w") as f:
        f.write(data)
    print(f"encoded {sys.argv[1]} into {puzzle_parts.DATA}")
