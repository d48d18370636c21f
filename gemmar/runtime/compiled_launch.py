"""A kernel launch prepared once and repeated cheaply: what keeps ranks that share a GPU starting together.

Ranks that share one GPU are launched one after another by one process, so the host time of a launch is
how far apart they start. Through Triton's dispatcher and torch's stream contexts a two_shot launch (two
kernels) cost 250-400 us of host time on an H200's host, and skipping only the dispatcher saved little:
the cost was spread over ~800 Python calls per launch (binding ~30 arguments, building the argument
tuples and tensor descriptors again, entering streams). :class:`PreparedLaunch` does all of that once, for
one kernel with fixed arguments; a later launch changes only the arguments the kernel does not specialise
on (``epoch``, ``parity``: Triton compiles those as plain integers, so any value runs the same compiled
kernel), or a tensor for another of the same dtype and alignment, and hands the compiled kernel its
arguments on its stream directly.

The first launch goes through Triton as usual (which compiles, or finds the kernel it has). The interpreter
has no compiled kernels: there every launch goes through Triton.
"""

import contextlib
import inspect


class PreparedLaunch:
    """``kernel[grid](*args, **kwargs)`` on ``stream`` (a torch stream, or None on cpu), launched by
    calling it with the per-launch values: ``prepared(epoch=3)``."""

    def __init__(self, kernel, grid, args, kwargs, stream=None, per_launch=()):
        self.kernel, self.grid, self.args, self.kwargs, self.stream = kernel, tuple(grid), args, kwargs, stream
        self.per_launch = tuple(per_launch)   # the arguments that change from one launch to the next
        params = inspect.signature(kernel.fn).parameters   # (the interpreter's kernels have no .params)
        names = list(params)
        values = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
        values.update(zip(names, args))
        values.update((k, v) for k, v in kwargs.items() if k in params)
        self.values = [values[n] for n in names]     # every parameter in order, constexprs included
        self.index = {n: i for i, n in enumerate(names)}
        # Under the interpreter nothing is compiled, so any argument may change.
        self.free = {p.name for p in kernel.params if p.do_not_specialize} if hasattr(kernel, "params") else \
            set(names)
        self.launcher = None

    def __call__(self, **changed):
        for name, value in changed.items():
            old = self.values[self.index[name]]
            if value is old:
                continue
            # A specialised argument could need another compiled kernel; a tensor is specialised only on its
            # dtype and whether its address is a multiple of 16, so another one alike runs the same kernel.
            if name not in self.free and not _same_specialisation(old, value):
                raise ValueError(f"{self.kernel.__name__}: {name} is specialised on, so it cannot change here")
            self.values[self.index[name]] = value
        if self.launcher is not None:
            self.launcher(*self.values, stream=self.stream.cuda_stream)
            return
        args = self.values[:len(self.args)]
        kwargs = {k: (self.values[self.index[k]] if k in self.index else v) for k, v in self.kwargs.items()}
        import torch

        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            compiled = self.kernel[self.grid](*args, **kwargs)
        if self.stream is not None and compiled is not None:
            # What Triton's dispatcher hands the compiled kernel: every parameter, in order.
            self.launcher = compiled[self.grid + (1,) * (3 - len(self.grid))]


def _same_specialisation(old, new):
    import torch

    return isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.dtype == new.dtype and \
        old.device == new.device and (old.data_ptr() % 16 == 0) == (new.data_ptr() % 16 == 0)
