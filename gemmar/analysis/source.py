"""The code next to the picture: a package function's source, read from the package at run time (never a
copy in a notebook), so what a notebook shows is exactly what runs."""

import inspect


def source(fn):
    """The source text of ``fn``: a plain function or a ``@triton.jit`` one (its decorator included)."""
    return inspect.getsource(getattr(fn, "fn", fn))


def show_source(fn, once=None):
    """``fn``'s source as a highlighted code block in a notebook. ``once``: a puzzle check's verdict; the source
    (which holds the puzzle's answer) is shown only when that check said right!, and a note otherwise."""
    from IPython.display import Code, Markdown

    if once is not None and not getattr(once, "right", False):
        name = getattr(getattr(fn, "fn", fn), "__name__", "it")
        return Markdown(f"*The package's own `{name}` is shown here once the check above says right!: solve the "
                        f"puzzle, run the check, then this cell again.*")
    return Code(source(fn), language="python")
