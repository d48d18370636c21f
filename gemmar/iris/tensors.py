"""Iris's tensor creation on gemmar's heap: ``shmem.zeros/ones/empty/full/rand/randn/randint/arange/linspace/
zeros_like/uniform``, ``allocate`` (``shmem.heap.allocate``), ``is_symmetric``, and ``iris.tensor_creation``'s
``is_valid_device``. A mixin of :class:`~gemmar.iris.host.Iris` (which gives it ``_heap``, ``get_device``).

Every rank makes the same calls in the same order, so every tensor has the same offset on every rank. Iris's
options are taken as Iris takes them: ``out=`` (checked: size, dtype, on the heap, in Iris's words, as a
RuntimeError), ``device=`` (the heap's; ``cuda`` is this rank's device on the cpu backend too), ``layout=``
(strided only), ``requires_grad=``, ``generator=``, ``memory_format=``, nested shapes, zero-size and 0-d tensors.
"""

import functools
import inspect
import math

import torch

from ..errors import UsageError
from ..runtime.heap import size_text
from ..programs import host_calls


class IrisRefusal(UsageError, RuntimeError):
    """A call Iris itself refuses with a RuntimeError (a device that is not the heap's, an ``out=`` tensor that does
    not fit): one line, as a RuntimeError as in Iris."""


def _shape(size):
    """Iris's allocators take a shape as separate ints or as one tuple/list (nested ones are flattened)."""
    while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in size):
        raise UsageError(f"shape {size!r} is not allowed: use whole numbers >= 0")
    return tuple(size)


def is_valid_device(device, iris_device):
    """Iris's ``tensor_creation.is_valid_device``: whether ``device`` names ``iris_device`` (None does; ``cuda``
    names the current GPU)."""
    if device is None:
        return True
    asked, mine = torch.device(device), torch.device(iris_device)
    return asked == mine or (asked.type == mine.type == "cuda" and asked.index is None)


def _keywords_checked(method):
    """A keyword the creation function does not take (Iris's take torch's, less ``pin_memory`` and the like) is
    refused in one line naming it and what is allowed, not swallowed."""
    allowed = [name for name, p in inspect.signature(method).parameters.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self"]

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        unknown = sorted(set(kwargs) - set(allowed))
        if unknown:
            raise UsageError(f"shmem.{method.__name__}(): {', '.join(unknown)} is not a keyword it takes; "
                             f"allowed: {', '.join(allowed)}")
        return method(self, *args, **kwargs)

    return checked


class TensorCreation:
    # -- allocators (every rank makes the same calls in the same order: same offsets everywhere) -------
    @property
    def device(self):
        """Iris's device string: the device of this rank's heap (``cuda:N``; ``cpu`` on the cpu backend)."""
        return str(self.get_device())

    @property
    def heap(self):
        """Iris's ``shmem.heap``: ``allocate(num_elements, dtype)`` from the symmetric heap."""
        return self

    def allocate(self, num_elements, dtype):
        try:
            return self._heap.empty((num_elements,), dtype, from_end=True)
        except UsageError:   # (the heap's own check; said here in the terms of gemmar run)
            nbytes = num_elements * torch.empty((), dtype=dtype).element_size()
            raise UsageError(f"the symmetric heap is full: {num_elements} x {dtype} needs {size_text(nbytes)} more "
                             f"than is left of the {size_text(self._heap.size)} each rank has; start the ranks with "
                             f"a larger --heap_size") from None

    def _check_device(self, device):
        """None, the heap's device, or (on a GPU) ``cuda`` for the current one; anything else is refused."""
        if device is None:
            return
        if self._heap.backend == "cpu":   # ("cuda" is this rank's device there, as everywhere in the program)
            device = host_calls._cpu_device(device)
        if is_valid_device(device, self.get_device()):
            return
        mine = self.get_device()
        raise IrisRefusal(f"device={str(device)!r}: Iris's tensors live in this rank's symmetric heap on {mine}; "
                          f"leave device out or pass {self.device!r}")

    def _create(self, shape, dtype, fill, device=None, layout=torch.strided, out=None, requires_grad=False,
                memory_format=torch.contiguous_format):
        """A heap tensor of ``shape`` (or ``out``, checked as Iris checks it), filled by ``fill(tensor)``."""
        self._check_device(device)
        if layout != torch.strided:
            raise UsageError(f"layout={layout}: tensors on the symmetric heap are dense; use torch.strided")
        dtype = dtype or torch.get_default_dtype()
        count = math.prod(shape)
        if out is not None:
            if out.numel() != count:
                raise IrisRefusal(f"The output tensor has {out.numel()} elements, but {count} are required")
            if out.dtype != dtype:
                raise IrisRefusal(f"The output tensor has dtype {out.dtype}, but {dtype} is required")
            if not self.is_symmetric(out):
                raise IrisRefusal("The output tensor is not on the symmetric heap: allocate it with this Iris "
                                  "instance (shmem.empty, shmem.heap.allocate)")
            tensor = out if tuple(out.shape) == tuple(shape) else out.view(shape)   # (Iris gives `out` itself back)
        else:
            flat = self.allocate(count, dtype)
            fits = {torch.channels_last: 4, torch.channels_last_3d: 5}.get(memory_format) == len(shape)
            if not fits:   # (a format for another number of dimensions leaves the tensor contiguous, as Iris does)
                tensor = flat.view(shape)
            else:   # channels_last & co: the same elements in the strides torch gives that format
                strides = torch.empty(shape, device="meta", memory_format=memory_format).stride()
                tensor = flat.as_strided(shape, strides)
        with torch.no_grad():
            fill(tensor)
        return tensor.requires_grad_(requires_grad)

    @_keywords_checked
    def empty(self, *size, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False,
              memory_format=torch.contiguous_format):
        return self._create(_shape(size), dtype, lambda t: None, device, layout, out, requires_grad, memory_format)

    @_keywords_checked
    def zeros(self, *size, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False):
        return self._create(_shape(size), dtype, torch.Tensor.zero_, device, layout, out, requires_grad)

    @_keywords_checked
    def ones(self, *size, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False):
        return self._create(_shape(size), dtype, lambda t: t.fill_(1), device, layout, out, requires_grad)

    @_keywords_checked
    def full(self, size, fill_value, dtype=None, device=None, layout=torch.strided, out=None, requires_grad=False):
        """As ``torch.full``: the dtype follows ``fill_value`` unless given."""
        dtype = dtype or torch.full((), fill_value).dtype
        return self._create(_shape((size,)), dtype, lambda t: t.fill_(fill_value), device, layout, out,
                            requires_grad)

    @_keywords_checked
    def zeros_like(self, tensor, dtype=None, device=None, layout=None, requires_grad=False,
                   memory_format=torch.preserve_format):
        if memory_format == torch.preserve_format:   # keep the input's strides where they are a known format
            memory_format = next((f for f in (torch.channels_last, torch.channels_last_3d)
                                  if tensor.dim() == (4 if f == torch.channels_last else 5) and
                                  tensor.is_contiguous(memory_format=f) and not tensor.is_contiguous()),
                                 torch.contiguous_format)
        return self._create(tuple(tensor.shape), dtype or tensor.dtype, torch.Tensor.zero_, device,
                            layout or tensor.layout, None, requires_grad, memory_format)

    def _random(self, size, dtype, draw, device, layout, out, requires_grad):
        shape = _shape(size)
        return self._create(shape, dtype, lambda t: t.copy_(draw(shape, dtype or torch.get_default_dtype())),
                            device, layout, out, requires_grad)

    @_keywords_checked
    def randn(self, *size, generator=None, dtype=None, device=None, layout=torch.strided, out=None,
              requires_grad=False):
        draw = lambda shape, dt: torch.randn(shape, generator=generator, dtype=dt, device=self.get_device())  # noqa
        return self._random(size, dtype, draw, device, layout, out, requires_grad)

    @_keywords_checked
    def rand(self, *size, generator=None, dtype=None, device=None, layout=torch.strided, out=None,
             requires_grad=False):
        draw = lambda shape, dt: torch.rand(shape, generator=generator, dtype=dt, device=self.get_device())  # noqa
        return self._random(size, dtype, draw, device, layout, out, requires_grad)

    @_keywords_checked
    def uniform(self, size, low=0.0, high=1.0, dtype=torch.float):
        return self._create(_shape((size,)), dtype, lambda t: t.uniform_(low, high))

    @_keywords_checked
    def randint(self, *args, dtype=None, generator=None, device=None, layout=torch.strided, out=None,
                requires_grad=False):
        """torch's ``randint([low,] high, size)`` (size a tuple), or Iris's older ``randint(size, low, high)``;
        int64 unless ``dtype`` says otherwise, as torch."""
        if len(args) in (2, 3) and isinstance(args[-1], (tuple, list, torch.Size)):
            low, high, size = args if len(args) == 3 else (0, *args)
        elif len(args) == 3:
            size, low, high = args
        else:
            raise UsageError(f"randint{args!r}: give ([low,] high, size) as torch does, or (size, low, high)")
        dtype = dtype or torch.int64
        draw = lambda shape, dt: torch.randint(low, high, shape, generator=generator, dtype=dt,  # noqa: E731
                                               device=self.get_device())
        return self._random((size,), dtype, draw, device, layout, out, requires_grad)

    @_keywords_checked
    def arange(self, start=0, end=None, step=1, dtype=None, device=None, layout=torch.strided, out=None,
               requires_grad=False):
        if end is None:
            start, end = 0, start
        if step == 0 or (end - start) * step < 0:
            raise UsageError(f"arange({start}, {end}, step={step}): the step must be non-zero and go from start "
                             f"towards end")
        values = torch.arange(start, end, step, dtype=dtype, device=self.get_device())
        return self._create((values.numel(),), values.dtype, lambda t: t.copy_(values), device, layout, out,
                            requires_grad)

    @_keywords_checked
    def linspace(self, start, end, steps, dtype=None, device=None, layout=torch.strided, out=None,
                 requires_grad=False):
        if isinstance(steps, (tuple, list, torch.Size)):   # (Iris takes a one-element shape too, nested or not)
            shape = _shape((steps,))
            steps = shape[0] if len(shape) == 1 else steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise UsageError(f"linspace steps={steps!r}: use a whole number >= 0")
        complex_ends = any(isinstance(v, complex) or (isinstance(v, torch.Tensor) and v.is_complex())
                           for v in (start, end))
        dtype = dtype or (torch.complex64 if complex_ends else torch.get_default_dtype())
        values = torch.linspace(start, end, steps, dtype=dtype, device=self.get_device())
        return self._create((steps,), dtype, lambda t: t.copy_(values), device, layout, out, requires_grad)

    def is_symmetric(self, tensor):
        """Whether ``tensor``'s memory lies in this rank's heap (so peers can reach it)."""
        arena = self._heap.arena
        # (an empty tensor's data_ptr() is 0: where it would start is its storage plus its offset)
        start = tensor.data_ptr() if tensor.numel() else \
            tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()
        # (the last element's end, whatever the strides)
        end = start + (sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride())) + 1) * tensor.element_size() \
            if tensor.numel() else start
        return tensor.device == arena.device and arena.data_ptr() <= start and end <= arena.data_ptr() + arena.numel()

    def as_symmetric(self, external_tensor):
        raise UsageError("as_symmetric: Iris maps a tensor's own memory into the heap with its vmem allocator; "
                         "gemmar's heaps are fixed arenas: allocate the tensor with shmem.empty/zeros and copy into it")

    def deallocate(self, pointer):
        """Iris frees nothing either: the heap is handed out again by the next ``iris.iris()``."""
