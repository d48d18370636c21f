"""A kernel launch prepared once and repeated cheaply: what keeps ranks that share a GPU starting together.

Ranks that share one GPU are launched one after another by one process, so the host time of a launch is
how far apart they start. Through Triton's dispatcher and torch's stream contexts a two_shot launch (two
kernels) cost 250-400 us of host time on an H200's host, and skipping only the dispatcher saved little:
the cost was spread over ~800 Python calls per launch (binding ~30 arguments, building the argument
tuples and tensor descriptors again, entering streams). :class:`PreparedLaunch` does all of that once, for
one kernel with fixed arguments; a later launch changes only the arguments the kernel does not specialise
on (``epoch``, ``parity``: Triton compiles those as plain integers, so any value runs the same compiled
kernel), or a tensor for another of the same dtype and alignment, and hands the compiled kernel its
arguments on its stream directly. Tensors reach it as their addresses, taken once: handed a tensor, Triton's
launcher calls its ``data_ptr`` and asks the driver whether that is a device pointer, and at few rows the
host's time per launch is what a launch takes.

The first launch goes through Triton as usual (which compiles, or finds the kernel it has). The interpreter
has no compiled kernels: there every launch goes through Triton.
"""

import contextlib
import inspect

import torch

# The per-launch arguments a spec may name (``Launch.per_launch``), as functions of the launch count.
EPOCH_VALUES = {"epoch": lambda count: count, "parity": lambda count: count % 2}


class PreparedLaunch:
    """``kernel[grid](*args, **kwargs)`` on ``stream`` (a torch stream, or None on cpu), launched with the
    launch count, ``prepared.at(3)``, which sets the arguments named in ``per_launch`` (``EPOCH_VALUES``),
    and any argument whose value changed: ``prepared.at(3, x=y)``."""

    def __init__(self, kernel, grid, args, kwargs, stream=None, per_launch=()):
        self.kernel, self.grid, self.args, self.kwargs, self.stream = kernel, tuple(grid), args, kwargs, stream
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
        fixed = [name for name in per_launch if name not in self.free]
        if fixed:
            raise ValueError(f"{kernel.__name__}: {fixed} change every launch, so the kernel must not specialise "
                             f"on them (do_not_specialize)")
        self.per_launch = [(self.index[name], EPOCH_VALUES[name]) for name in per_launch]
        self.launcher = None
        self.addresses = None   # self.values with each tensor as its address: what the compiled kernel is handed
        self.stream_handle = None

    def at(self, count, **changed):
        """Launch number ``count``: its per-launch arguments set from it, and any other argument given a new
        value (``x=...``)."""
        for name, value in changed.items():
            i = self.index[name]
            old = self.values[i]
            if value is old:
                continue
            # A specialised argument could need another compiled kernel; a tensor is specialised only on its
            # dtype and whether its address is a multiple of 16, so another one alike runs the same kernel.
            if name not in self.free and not _same_specialisation(old, value):
                raise ValueError(f"{self.kernel.__name__}: {name} is specialised on, so it cannot change here")
            self._set(i, value)
        for i, value_at in self.per_launch:
            self._set(i, value_at(count))
        if self.launcher is not None:
            self.launcher(*self.addresses, stream=self.stream_handle)
        else:
            self._first_launch()

    def _set(self, i, value):
        self.values[i] = value
        if self.addresses is not None:
            self.addresses[i] = _address(value)

    def _first_launch(self):
        """Through Triton's dispatcher (every launch under the interpreter); on a GPU, keeps what it ran."""
        args = self.values[:len(self.args)]
        kwargs = {k: (self.values[self.index[k]] if k in self.index else v) for k, v in self.kwargs.items()}
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            compiled = self.kernel[self.grid](*args, **kwargs)
        if self.stream is not None and compiled is not None:
            # What Triton's dispatcher hands the compiled kernel: every parameter, in order.
            self.launcher = compiled[self.grid + (1,) * (3 - len(self.grid))]
            self.addresses = [_address(value) for value in self.values]
            self.stream_handle = self.stream.cuda_stream


def _address(value):
    """A tensor's address (the launcher takes an integer as a pointer as it is); anything else unchanged. The
    tensor itself stays referenced in ``values``, so its memory stays allocated."""
    return value.data_ptr() if isinstance(value, torch.Tensor) else value


def _same_specialisation(old, new):
    return isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.dtype == new.dtype and \
        old.device == new.device and (old.data_ptr() % 16 == 0) == (new.data_ptr() % 16 == 0)
