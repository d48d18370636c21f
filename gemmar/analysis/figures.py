"""What every figure of the package shares: program colours, text drawn as written, units, and the last step
(laid out, saved, and in a notebook shown under the cell whatever the kernel's matplotlib state)."""

import functools
import sys

import numpy as np

MAX_LISTED_PROGRAMS = 4096   # above this many programs, colours come from a ramp, not a list of one per program


def program_colormap(num_programs):
    """One colour per program, the same in every figure (schedule, tile grid): distinct colours for up to 20
    programs, a smooth ramp beyond (so 132 programs never reuse a colour), with colour-bar bounds 0..P-1."""
    from matplotlib.colors import BoundaryNorm, ListedColormap, Normalize
    import matplotlib.pyplot as plt

    P = max(1, int(num_programs))
    if P > MAX_LISTED_PROGRAMS:   # (a trace may name program 2**20 - 1: a colour per program would take GiBs)
        return plt.get_cmap("turbo"), Normalize(-0.5, P - 0.5)
    base = plt.get_cmap("tab10" if P <= 10 else "tab20" if P <= 20 else "turbo")
    colors = base.colors[:P] if P <= 20 else base(np.linspace(0, 1, P))
    return ListedColormap(colors), BoundaryNorm(np.arange(-0.5, P), P)


def program_colorbar(fig, image, ax, num_programs, **kw):
    """A colour bar for program colours: every program's tick up to 20, a few round ones beyond."""
    bar = fig.colorbar(image, ax=ax, fraction=0.046, **kw)
    P = max(1, int(num_programs))
    bar.set_ticks(range(P) if P <= 20 else [int(t) for t in np.linspace(0, P - 1, 6)])
    bar.minorticks_off()
    return bar


def plain_text():
    """Text drawn as written: trace files' names and labels are data, not matplotlib formulas ($...$)."""
    import matplotlib

    return matplotlib.rc_context({"text.parse_math": False})


def drawn_as_written(draw):
    """``draw`` with its text drawn as written (:func:`plain_text`)."""
    def wrapper(*args, **kwargs):
        with plain_text():
            return draw(*args, **kwargs)
    return functools.wraps(draw)(wrapper)


def finish_figure(fig, path=None, show=True):
    """Every figure's last step: lay it out, save it as a PNG when ``path`` is given, and in a notebook show it
    under the cell (:func:`shown`; ``show=False``: not, for a figure drawn elsewhere, as the explorer's)."""
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return shown(fig) if show else fig


def _kernel_shell():
    """The IPython shell of the Jupyter kernel this runs in; None in a script, a test or a terminal IPython."""
    ipython = sys.modules.get("IPython")   # (never imported here: a script has no use for it)
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if getattr(shell, "kernel", None) is not None else None


def display_png(fig):
    """Show ``fig`` as a PNG in the running cell's output (the inline backend's rendering, without it)."""
    from IPython.core.pylabtools import print_figure
    from IPython.display import Image, display

    display(Image(data=print_figure(fig, "png", bbox_inches="tight"), format="png"))


def shown(fig):
    """``fig``, shown under the running cell when this runs in a Jupyter kernel, whatever the kernel's matplotlib
    state; returned either way.

    The inline backend draws a figure at the cell's end only while matplotlib is interactive, which a notebook
    that never ran ``%matplotlib inline`` (or called ``plt.ioff()``) is not: its chart silently never appeared.
    So the figure is displayed here and closed, so that the inline backend does not draw it a second time; and
    returned as a cell's last value (no ``;``) it is not displayed again in the same cell (a later cell that
    names it shows it). Outside a kernel (a script, the command line, the tests), or with a backend that draws
    figures itself (ipympl's widget, a window), it is left alone."""
    shell = _kernel_shell()
    if shell is None:
        return fig
    import matplotlib
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend().lower()
    if "inline" not in backend and backend != "agg":
        return fig
    display_png(fig)
    plt.close(fig)
    cell = shell.execution_count
    fig._ipython_display_ = lambda: None if shell.execution_count == cell else display_png(fig)
    return fig


def plural(count, noun):
    return f"{count} {noun}" + ("" if count == 1 else "s")


def time_unit(span_us):
    """(divisor, label): µs for GPU-scale spans, ms for the interpreter's seconds-long ones."""
    return (1.0, "µs") if span_us < 20_000 else (1e3, "ms")
