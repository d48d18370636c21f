"""The code next to the picture: a package function's source, read from the package at run time (never a
copy in a notebook), so what a notebook shows is exactly what runs."""

import inspect


def source(fn):
    """The source text of ``fn``: a plain function or a ``@triton.jit`` one (its decorator included)."""
    return inspect.getsource(getattr(fn, "fn", fn))


def show_source(fn):
    """``fn``'s source as a highlighted code block in a notebook."""
    from IPython.display import Code

    return Code(source(fn), language="python")
