"""Iris's device side on gemmar: ``DeviceContext``, the timers of ``iris.device.utils``, and the device API.

The device API itself is gemmar's (``gemmar.kernels.device``): the same functions, Iris's argument order and
keywords (``mask=``, ``other=``, ``cache_modifier=``, ``volatile=``, ``hint=``, ``sem=``, ``scope=``). This
module adds what today's Iris programs reach for besides:

- ``DeviceContext`` (Iris: ``iris.DeviceContext``, ``iris.Context``): made in a kernel with
  ``ctx = DeviceContext.initialize(context_tensor, rank, world_size)`` from ``shmem.get_device_context()``,
  then ``ctx.load(ptr, from_rank)``, ``ctx.store(ptr, value, to_rank)``, ``ctx.get``, ``ctx.put``,
  ``ctx.copy`` and ``ctx.atomic_*(ptr, ..., to_rank, sem=, scope=)``: the rank and the heap bases travel
  inside it. The context tensor is ``[rank, world_size, heap_base_0 .. heap_base_W-1]`` (int64).
- ``read_realtime`` (gemmar's ``now()``: ns, so ``iris.hip.get_wall_clock_rate`` is 1e6 kHz), ``get_cu_id``
  (the program id: there is no SM id to read under the interpreter) and ``get_xcc_id`` (0: one die).

Why a helper around Triton's ``aggregate``: the interpreter's ``triton.jit`` makes an ``InterpretedFunction``,
which ``aggregate`` does not count as a method, so under the interpreter an aggregate loses every jit method
(``DeviceContext.initialize`` raised "type object has no attribute 'initialize'" on Triton 3.9).
:func:`device_aggregate` puts them back; compiled, the class is Triton's aggregate unchanged.
"""

import triton
import triton.language as tl
from triton.language.core import _aggregate

from ..kernels.device import (INTERPRETER, atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or,
                              atomic_sub, atomic_xchg, atomic_xor, copy, get, load, now, put, store, translate)

__all__ = ["DeviceContext", "Context", "read_realtime", "get_cu_id", "get_xcc_id", "translate", "load", "store",
           "copy", "get", "put", "atomic_add", "atomic_sub", "atomic_cas", "atomic_xchg", "atomic_min", "atomic_max",
           "atomic_and", "atomic_or", "atomic_xor"]


def device_aggregate(cls):
    """Triton's ``aggregate`` of ``cls``; under the interpreter, with the jit methods it drops put back."""
    made = _aggregate(cls)
    if not INTERPRETER:
        return made
    for name, member in vars(cls).items():
        function = member.__func__ if isinstance(member, staticmethod) else member
        if type(function).__name__ != "InterpretedFunction" or name in vars(made):
            continue
        if isinstance(member, staticmethod):
            setattr(made, name, staticmethod(function))
        else:   # an InterpretedFunction is no descriptor: bind self by hand
            setattr(made, name, (lambda f: lambda self, *args, **kwargs: f(self, *args, **kwargs))(function))
    return made


@triton.jit
def read_realtime():
    """A timestamp in ns (gemmar's ``now()``); Iris's reads AMD's 100 MHz clock, hence its rate of 1e6 kHz here."""
    return now()


@triton.jit
def get_cu_id():
    """The program id: which SM a program runs on is not a thing the interpreter has."""
    return tl.program_id(0)


@triton.jit
def get_xcc_id():
    """0: NVIDIA GPUs and the CPU are one die."""
    return tl.full((), 0, tl.int32)


@device_aggregate
class DeviceContext:
    """A rank's view of the symmetric heap inside a kernel: its rank, the world size and every heap's base."""

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank, world_size, tracing: tl.constexpr = False):
        """From ``shmem.get_device_context()``: ``[rank, world_size, heap bases...]``. ``rank`` and
        ``world_size`` must be constexprs of the kernel. (Iris's device-side tracing is not kept here: gemmar
        traces with its own events; ``tracing=True`` records nothing.)"""
        return DeviceContext(rank, world_size, context_tensor + 2)

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier=None, volatile=False,
             hint: tl.constexpr = None):
        return load(pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile, hint)

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier=None, hint: tl.constexpr = None):
        store(pointer, value, self.rank, to_rank, self.heap_bases, mask, hint, cache_modifier)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier=None,
            store_cache_modifier=None, hint: tl.constexpr = None):
        get(from_ptr, to_ptr, from_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier=None,
            store_cache_modifier=None, hint: tl.constexpr = None):
        put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask, other, load_cache_modifier,
            store_cache_modifier, hint)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None, load_cache_modifier=None,
             store_cache_modifier=None, hint: tl.constexpr = None):
        copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
             store_cache_modifier, hint)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope, hint)

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem=None, scope=None, hint: tl.constexpr = None):
        return atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)


Context = DeviceContext
