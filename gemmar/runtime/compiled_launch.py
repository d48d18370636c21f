"""Launching a compiled kernel again without Triton's dispatcher, for ranks that share a GPU.

Ranks that share one GPU are launched one after another by one process, so the host time of a launch is
how far apart they start: Triton's dispatcher (binding ~30 arguments, computing the specialisation key,
looking the kernel up) cost ~100 us per kernel on an H200's host, and a two_shot launch is two kernels.
After the first launch of a kernel with a given set of argument values, :class:`CompiledLaunches` keeps
the compiled kernel Triton returned and launches it directly.

It is keyed on every argument's exact value (tensors by dtype and address, tensor descriptors by their
tensor, shape and block), except the arguments the kernel was told not to specialise on (``epoch``,
``rank``, ``timeout_ns``: Triton compiles those as plain integers, so any value reuses the kernel). Any other
change - a new tensor, a new shape - goes through Triton again, which compiles or finds what it already
has. The interpreter has no compiled kernels: there this always goes through Triton.
"""

import inspect

import torch


def _value_key(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr(), tuple(value.shape), tuple(value.stride()))
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor):   # a TensorDescriptor
        return ("descriptor", _value_key(base), tuple(value.shape), tuple(value.strides), tuple(value.block_shape),
                getattr(value, "padding", None))
    if isinstance(value, int) and not isinstance(value, bool):
        return ("int", value)
    return (type(value).__name__, id(value) if callable(value) else value)


class CompiledLaunches:
    """``launch(kernel, grid, args, kwargs)``: the first time through Triton, afterwards the compiled kernel."""

    def __init__(self, device_type):
        self.compiled = {} if device_type == "cuda" else None
        self.direct = 0   # launches that skipped the dispatcher (for tests and the launch-cost benchmark)

    def launch(self, kernel, grid, args, kwargs):
        if self.compiled is None:
            kernel[grid](*args, **kwargs)
            return
        names = kernel.arg_names
        values = {p.name: p.default for p in kernel.params if p.default is not inspect.Parameter.empty}
        values.update(zip(names, args))
        values.update((k, v) for k, v in kwargs.items() if k in names)
        free = {p.name for p in kernel.params if p.do_not_specialize}
        key = (kernel, tuple(grid), tuple(kw for kw in sorted(kwargs.items()) if kw[0] not in names),
               tuple(("free", type(values[n]).__name__) if n in free else _value_key(values[n]) for n in names))
        compiled = self.compiled.get(key)
        if compiled is None:
            self.compiled[key] = kernel[grid](*args, **kwargs)
            return
        # Every parameter in order, constexprs included: what Triton's own dispatcher hands the launcher.
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*(values[n] for n in names))
        self.direct += 1
