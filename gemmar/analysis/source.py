"""The code next to the picture: a package function's source, read from the package at run time (never a
copy in a notebook), so what a notebook shows is exactly what runs."""

import inspect


def source(fn):
    """The source text of ``fn``: a plain function or a ``@triton.jit`` one (its decorator included)."""
    if is_answer(fn):   # (inspect finds no source for these in a notebook's process: kernels/sealed.py)
        from ..kernels import sealed

        return sealed.source(getattr(fn, "fn", fn).__name__)
    return inspect.getsource(getattr(fn, "fn", fn))


def show_source(fn, once=None):
    """``fn``'s source as a highlighted code block in a notebook. ``once``: a puzzle check's verdict; the source
    (which holds the puzzle's answer) is shown only when that check said right!, and a note otherwise."""
    from IPython.display import Code, Markdown

    plain = getattr(fn, "fn", fn)
    name = getattr(plain, "__name__", "it")
    if is_answer(fn) and not getattr(once, "right", False):
        # A puzzle's answer (the package's own part, kernels/sealed.py) is shown only with its check's verdict,
        # once right.
        return Markdown(f"*The package's own `{name}` is the answer to a puzzle: it is shown here once the puzzle's "
                        f"check says right! (pass the check's verdict: `show_source({name}, once=verdict)`).*")
    if once is not None and not getattr(once, "right", False):
        return Markdown(f"*The package's own `{name}` is shown here once the check above says right!: solve the "
                        f"puzzle, run the check, then this cell again.*")
    return Code(source(fn), language="python")


def is_answer(fn):
    """Whether ``fn`` is one of the package's answers to the notebooks' puzzles (``kernels/sealed.py``)."""
    from ..kernels.sealed import is_sealed

    return is_sealed(fn)
