"""Which Triton releases gemmar accepts, the work-arounds accepted releases need, and a faster interpreter.

This module is the one owner of every patch to Triton's interpreter, gemmar's and those of the layers above
(the sanitizer, the hosted-program layer): :data:`PATCHES` lists them in the order they are applied, each with
its reason, and :func:`gemmar_interpreter` applies them only inside its scope and gives Triton's interpreter
back exactly as it was on leaving it. The layers above fill their slots with :func:`subscribe`; this module
imports none of them. It is the owner because the patches exist for what the accepted releases lack, which
this module names (a patch and the releases it is for are read together), and because it is the lowest
module (imported by ``gemmar.kernels`` before any kernel is defined) that every layer may import. So a
participant's own ``@triton.jit`` kernel launched outside gemmar's launches runs on Triton's interpreter as
Triton ships it; gemmar enters the scope around each kernel it runs on cpu ranks (``CpuHeap.on_stream``,
``PreparedLaunch``) and around a whole hosted program.

Triton 3.6's interpreter turns a scalar into a Python int with ``int(array)``, and its scalars (e.g.
``tl.program_id``) are one-element 1-D numpy arrays. NumPy 2.4 refuses ``int()`` of an array that is not
0-D, so under 3.6 with a current NumPy every ``range(pid, ...)`` in a kernel failed with "only 0-dimensional
arrays can be converted to Python scalars". Triton 3.7 squeezes the array first;
:func:`_index_of_one_element_arrays` does the same for 3.6. Compiled kernels never reach this code.

Two costs of the interpreter are cut: the language is patched once per launch, not at every call of a
``@triton.jit`` helper (:func:`_patch_once_per_launch`), and integer-overflow checks whose assert cannot fire
are skipped (:func:`_skip_overflow_checks_that_cannot_fire`).

Two gaps of the interpreter (every accepted release) are filled by :func:`_patch_bf16_and_atomics`:

- **bf16 arithmetic**: the interpreter keeps bf16 values as their uint16 bits and runs ``+``, ``*``, ``<`` ... on
  those integers (``1.0 + 1.0`` gave ``2**127``). A bf16 operation is computed in fp32 here and rounded back to
  bf16 (round to nearest even), as a GPU does. ``tl.dot`` converted only 8-bit float operands, so a bf16 GEMM
  multiplied the bit patterns (C ~ 7e10 for ~1: every bf16 case of Iris's tests/ops); its bf16 operands are
  given as their fp32 values (exact).
- **atomics its C helper refuses** (``Unsupported data type``: fp32 ``atomic_xchg``, bf16 ``atomic_add``,
  float min/max ...) **or does not make atomic across processes** (fp16 ``atomic_add`` lost 52 of 1M updates
  between two ranks: elements under 4 bytes): done as a compare-and-swap loop on each element's bits, which is
  as atomic across processes as the native 32- and 64-bit ones (elements under 4 bytes: a CAS of their aligned
  32-bit word, the bits around them kept as they were).

And one of casts (Triton 3.9.0, where it was found, and the same code in 3.6, 3.7 and 3.8), by
:func:`_patch_casts_to_bf16`:

- **casts to bf16**: the interpreter's ``cast_impl`` (behind every ``create_si_to_fp``, ``create_fp_trunc`` ...:
  explicit ``.to(tl.bfloat16)`` and the implicit casts of stores and atomics into a bf16 pointer) turns an
  integer into bf16 by taking its low 16 bits as bf16 bits (``atomic_add(bf16_ptr, 1)`` added 9.18e-41, not
  1.0), an fp64 value likewise, and fp32 (and fp16, through fp32) by dropping the low 16 bits (truncation). A
  compiled kernel rounds to nearest even: an integer through fp32 (Triton's NVIDIA lowering converts it to
  fp32 first, as torch does), fp32 and fp16 directly, fp64 once (LLVM's ``fptrunc``). Casts to fp16 were
  right already (numpy's conversion rounds to nearest even).

And one of library calls (every accepted release), by :func:`_libdevice_math`: ``triton.language.extra.libdevice``
is a module of stubs that a compiled kernel replaces with the GPU's library, so under the interpreter
``libdevice.fast_expf(x)`` returned None (Iris's flash decode: "'NoneType' object is not subscriptable"). Its
common math functions (``LIBDEVICE_UNARY``, ``LIBDEVICE_BINARY``) are computed by numpy in the argument's dtype
(bf16 through fp32); the ``fast_`` ones give the precise value, where the GPU's approximation may differ in the
last bits.
"""

import contextlib
import os
import threading

import triton
import triton.language as tl
from triton.language.core import _aggregate

from ..errors import UsageError

# The accepted releases: what pyproject.toml allows and CI runs (the full suite on one, a smoke run on the rest).
ACCEPTED = ((3, 6), (3, 10))   # lowest accepted, first refused
ACCEPTED_TEXT = "3.6 to 3.9"


def release(version_text):
    """'3.6.0' / '3.9.0+git1234' -> (3, 6)."""
    parts = version_text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise UsageError(f"cannot read Triton's version {version_text!r}: gemmar needs Triton "
                         f"{ACCEPTED_TEXT}") from None


def check_release(version_text):
    """One line naming the installed version and the accepted range, when it is outside it."""
    if not ACCEPTED[0] <= release(version_text) < ACCEPTED[1]:
        raise UsageError(f"Triton {version_text} is installed; gemmar needs Triton {ACCEPTED_TEXT} "
                         f"(pip install 'triton>=3.6,<3.10')")


def _index_of_one_element_arrays(replace):
    """Triton 3.6 only: make the interpreter's ``__index__`` accept one-element arrays (see the module doc)."""
    from triton.runtime import interpreter

    if release(triton.__version__) != (3, 6):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_squeezing(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    replace(interpreter, "_patch_lang_tensor", patch_tensor_squeezing)


class _KernelPatches:
    """The language patches of one interpreted kernel launch: undone by the launch's ``restore()``, which also
    ends the launch for :func:`_patch_once_per_launch`. ``langs``: the language modules patched so far;
    ``later``: patches a device function of the launch needed beyond the kernel's own (``tl.core`` for
    ``tl.zeros``), undone first."""

    def __init__(self, scope, state, langs):
        self.scope, self.state, self.langs, self.later = scope, state, langs, []

    def restore(self):
        self.state["launch"] = None
        while self.later:
            self.later.pop().restore()
        self.scope.restore()


class _NothingPatched:
    def restore(self):
        pass


# function -> (its globals' size, the language modules among them): kept from one scope to the next
_SEEN_LANGS = None


def _patch_once_per_launch(replace):
    """Patch Triton's language once per interpreted launch, not again at every call of a @triton.jit helper.

    The interpreter patches ``triton.language`` (its builtins, its tensor's methods) when a kernel launch
    starts, and again at each call of a device function from it, though the modules patched are the same
    objects, nearly all of it in ``inspect.getmembers`` (docs/decisions.md, the interpreter's costs). A
    device function whose language modules the running launch has patched already is called as it is; one
    that sees a module the launch has not patched yet (Triton's own ``tl.zeros`` and ``tl.cdiv`` see
    ``tl.core``) has it patched once, until the launch ends. The interpreter's patches are global, so it ran
    one launch at a time before this too."""
    import inspect
    import weakref

    import triton.language as tl
    from triton.runtime import interpreter

    global _SEEN_LANGS
    if _SEEN_LANGS is None:
        _SEEN_LANGS = weakref.WeakKeyDictionary()
    seen_langs = _SEEN_LANGS
    patch_lang = interpreter._patch_lang
    state = {"launch": None}   # the running launch's patches (_KernelPatches); None between launches

    def patch_lang_once_per_launch(fn):
        # Looked at again only when its module's globals have gained or lost names (the interpreter's first
        # rewrite of a function adds some): ``inspect.ismodule`` over every global at every call cost more
        # than the helpers it looked at.
        size, langs = seen_langs.get(fn, (None, None))
        if size != len(fn.__globals__):
            langs = frozenset(id(m) for m in fn.__globals__.values() if inspect.ismodule(m) and m in (tl, tl.core))
            seen_langs[fn] = (len(fn.__globals__), langs)
        # (and only while the patches are in place: tl.load is then the interpreter's, not the builtin)
        launch = state["launch"] if not tl.core.is_builtin(tl.load) else None
        if launch is not None and langs <= launch.langs:
            return _NothingPatched()
        scope = patch_lang(fn)
        if launch is not None:   # kept until the launch ends, whether or not this call's end restores its scope
            launch.later.append(scope)
            launch.langs = launch.langs | langs
            return _NothingPatched()
        # a launch starts (the interpreter restores its patches when it ends)
        state["launch"] = _KernelPatches(scope, state, langs)
        return state["launch"]

    replace(interpreter, "_patch_lang", patch_lang_once_per_launch)


def _skip_overflow_checks_that_cannot_fire(replace):
    """Skip the interpreter's integer-overflow check where its assert could never fire.

    For every ``+``, ``-``, ``*`` of 32-bit integers the interpreter computes the result again in 64 bits,
    compares it with the type's limits and hands the outcome to ``device_assert``, which does nothing unless
    the launch runs with ``debug`` (the interpreter's options never set it, in every accepted release). Five
    interpreted operations per index operation for no effect, the largest cost of a small launch on cpu
    ranks (docs/decisions.md, the interpreter's costs). With ``debug`` on, the check runs as before."""
    from triton.runtime import interpreter

    semantic = interpreter.interpreter_semantic
    check = semantic.binary_op_sanitize_overflow_impl

    def overflow_check_when_it_can_fire(lhs, rhs, binary_op):
        if semantic.builder.options.debug:
            return check(lhs, rhs, binary_op)

    replace(semantic, "binary_op_sanitize_overflow_impl", overflow_check_when_it_can_fire)


def _bf16_as_fp32(bits):
    import numpy as np

    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _fp32_as_bf16(values):
    """fp32 -> bf16 bits, rounded to nearest even (NaN stays a quiet NaN)."""
    import numpy as np

    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _take_new(old, new):
    return new


# (numpy's names: numpy is imported only when the interpreter runs)
RMW_COMBINE = {"ADD": "add", "FADD": "add", "MIN": "minimum", "UMIN": "minimum", "MAX": "maximum", "UMAX": "maximum",
               "AND": "bitwise_and", "OR": "bitwise_or", "XOR": "bitwise_xor"}


def _is_bf16(handle):
    import numpy as np
    import triton.language as tl

    return handle.dtype.scalar == tl.bfloat16 and handle.data.dtype == np.uint16


def _rmw_by_compare_and_swap(op_name, ptr, val, mask, interpreter_sem):
    """An atomic read-modify-write (``op_name``: ADD, FADD, MIN, ..., XCHG) of ``val`` at ``ptr`` done as
    compare-and-swap loops: the values seen before (numpy, ``val``'s dtype)."""
    import numpy as np
    from triton._C.libtriton import interpreter as native

    # Read the bits, compute the new values, swap them in where nobody changed them since; retry the rest.
    # Elements narrower than 4 bytes are swapped inside their aligned 32-bit word (a CAS of that width is
    # atomic across processes; the bits around the element are compared and kept as they were). Two
    # elements of one word in one call: the second's swap fails once and is retried with the first's result.
    width = max(val.dtype.scalar.primitive_bitwidth, 8)
    bits_type = np.dtype(f"uint{width}")
    word_type = np.dtype(np.uint32) if width < 32 else bits_type
    value_type = val.data.dtype
    combine = _take_new if op_name == "XCHG" else getattr(np, RMW_COMBINE[op_name])
    pointers, values = np.broadcast_arrays(ptr.data, val.data)
    enabled = np.broadcast_to(mask.data, pointers.shape).astype(bool)
    addresses = pointers[enabled].astype(np.uint64)
    values = values[enabled]
    words = addresses & ~np.uint64(3) if width < 32 else addresses
    shifts = (addresses - words) * np.uint64(8)
    low_bits = np.uint64((1 << width) - 1)

    def new_bits(mine, value):
        if _is_bf16(val):
            return _fp32_as_bf16(combine(_bf16_as_fp32(mine), _bf16_as_fp32(value))).astype(np.uint64)
        result = np.asarray(combine(mine.astype(bits_type).view(value_type), value), dtype=value_type)
        return np.broadcast_to(result, mine.shape).astype(value_type).view(bits_type).astype(np.uint64)

    seen = native.load(words, np.ones(words.shape, bool), np.zeros(words.shape, word_type), word_type)
    before = np.zeros(words.shape, np.uint64)
    pending = np.arange(words.size)
    while pending.size:
        word = seen[pending].astype(np.uint64)
        mine = (word >> shifts[pending]) & low_bits
        replaced = (word & ~(low_bits << shifts[pending])) | (new_bits(mine, values[pending]) << shifts[pending])
        swapped = native.atomic_cas(words[pending], seen[pending], replaced.astype(word_type), interpreter_sem)
        done = swapped == seen[pending]
        before[pending[done]] = mine[done]
        seen[pending] = swapped
        pending = pending[~done]
    old = np.zeros(pointers.shape, dtype=value_type)
    old[enabled] = before.astype(bits_type).view(value_type)
    return old


def _patch_bf16_and_atomics(replace):
    """bf16 arithmetic in fp32, and atomics on every dtype (see the module's docstring)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    binary_op, unary_op = builder.binary_op, builder.unary_op
    rmw = builder.create_atomic_rmw

    def bf16_binary_op(self, lhs, rhs, op):
        if not (_is_bf16(lhs) and _is_bf16(rhs)):
            return binary_op(self, lhs, rhs, op)
        out = op(_bf16_as_fp32(lhs.data), _bf16_as_fp32(rhs.data))
        if out.dtype == np.bool_:   # a comparison: kept as the interpreter keeps them
            return interpreter.TensorHandle(out, lhs.dtype.scalar)
        return interpreter.TensorHandle(_fp32_as_bf16(out), lhs.dtype.scalar)

    def bf16_unary_op(self, arg, op):
        if not _is_bf16(arg):
            return unary_op(self, arg, op)
        return interpreter.TensorHandle(_fp32_as_bf16(op(_bf16_as_fp32(arg.data))), arg.dtype.scalar)

    def create_fma(self, x, y, z):
        if not _is_bf16(z):
            return fma(self, x, y, z)
        product = _bf16_as_fp32(x.data).astype(np.float64) * _bf16_as_fp32(y.data)
        return interpreter.TensorHandle(_fp32_as_bf16(product + _bf16_as_fp32(z.data)), z.dtype.scalar)

    fma = builder.create_fma

    def create_atomic_rmw(self, rmw_op, ptr, val, mask, sem, scope):
        if val.dtype.scalar.primitive_bitwidth >= 32:
            try:
                return rmw(self, rmw_op, ptr, val, mask, sem, scope)
            except ValueError as error:
                if "Unsupported data type" not in str(error):
                    raise
        old = _rmw_by_compare_and_swap(rmw_op.name, ptr, val, mask, self.ir_sem_to_interpreter_sem[sem])
        return interpreter.TensorHandle(old, val.dtype.scalar)

    replace(builder, "binary_op", bf16_binary_op)
    replace(builder, "unary_op", bf16_unary_op)
    replace(builder, "create_fma", create_fma)
    replace(builder, "create_atomic_rmw", create_atomic_rmw)
    # (the class's create_fadd etc. are lambdas that look binary_op up on the instance, so they take this one)

    dot = builder.create_dot

    def create_dot(self, a, b, *rest):
        # (the interpreter converts only 8-bit float operands; a bf16 one is its uint16 bits, which np.matmul
        # multiplied as integers: ~1e10 for values near 1. A bf16 value is exact in fp32, as a GPU's MMA takes it.)
        a, b = (interpreter.TensorHandle(_bf16_as_fp32(h.data), tl.float32) if _is_bf16(h) else h for h in (a, b))
        return dot(self, a, b, *rest)

    replace(builder, "create_dot", create_dot)


def _fp64_as_bf16(values):
    """fp64 -> bf16 bits rounded once to nearest even: through fp32 rounded to odd (the low bit set where fp32
    dropped something), which has enough bits beyond bf16's that rounding it again cannot round twice."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = values.astype(np.float32)
        bits = nearest.view(np.uint32).copy()
        # rounded away from zero (inf included): one fp32 step back toward zero, so that fp32 truncated
        bits -= (np.abs(nearest.astype(np.float64)) > np.abs(values)).astype(np.uint32)
        bits |= (bits.view(np.float32).astype(np.float64) != values).astype(np.uint32)
    return np.where(np.isnan(values), np.uint16(0x7FC0), _fp32_as_bf16(bits.view(np.float32)))


def _patch_casts_to_bf16(replace):
    """Casts to bf16 round to nearest even, as compiled kernels do (see the module's docstring)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    cast = builder.cast_impl

    def cast_rounding_to_nearest_even(self, src, dst_type):
        source = src.dtype.scalar
        # (bf16 to bf16 is no cast; fp8 values are kept as their bits, and never reach cast_impl to bf16)
        if dst_type.scalar != tl.bfloat16 or source == tl.bfloat16 or source.is_fp8():
            with np.errstate(over="ignore"):   # (fp32 past fp16's range is inf, as on a GPU: no numpy warning)
                return cast(self, src, dst_type)
        data = np.atleast_1d(src.data)
        bits = _fp64_as_bf16(data) if source == tl.float64 else _fp32_as_bf16(data.astype(np.float32))
        return interpreter.TensorHandle(bits.reshape(np.shape(src.data)), dst_type.scalar)

    # (create_si_to_fp, create_fp_trunc ... are lambdas that look cast_impl up on the instance: they take this one)
    replace(builder, "cast_impl", cast_rounding_to_nearest_even)


# libdevice's math functions that run under the interpreter (:func:`_libdevice_math`), by the numpy function that
# computes each in the argument's dtype; a "fast_" one is its precise value (a GPU's approximation differs from it in
# the last bits).
LIBDEVICE_UNARY = {"exp": "exp", "fast_expf": "exp", "exp2": "exp2", "log": "log", "fast_logf": "log", "log2": "log2",
                   "fast_log2f": "log2", "log10": "log10", "fast_log10f": "log10", "sqrt": "sqrt", "tanh": "tanh",
                   "sin": "sin", "fast_sinf": "sin", "cos": "cos", "fast_cosf": "cos", "floor": "floor", "ceil": "ceil",
                   "abs": "abs", "fabs": "abs", "trunc": "trunc", "rint": "rint", "expm1": "expm1", "log1p": "log1p"}
LIBDEVICE_BINARY = {"pow": "power", "fast_powf": "power", "fmax": "fmax", "fmin": "fmin", "fast_dividef": "divide",
                    "div_rn": "divide", "fmod": "fmod", "atan2": "arctan2"}


def _libdevice_math(replace):
    """libdevice's common math functions under the interpreter (see the module's docstring)."""
    import numpy as np
    from triton.language.extra import libdevice
    from triton.runtime import interpreter

    if os.environ.get("TRITON_INTERPRET", "0") != "1":   # (a hosted program on a GPU: its kernels compile, and
        return                                             # the code generator must find libdevice's own names)

    def numpy_call(name, function):
        def call(*args, _semantic=None, **_):
            like = next((a for a in args if isinstance(a, tl.tensor)), None)
            if like is None:   # (only Python numbers: an fp32 scalar, as the GPU library gives)
                with np.errstate(all="ignore"):
                    out = np.asarray(function(*(np.float32(a) for a in args)), dtype=np.float32)
                return tl.tensor(interpreter.TensorHandle(out.reshape(1), tl.float32), tl.float32)
            scalar = like.dtype.scalar if hasattr(like.dtype, "scalar") else like.dtype
            values = [a.handle.data if isinstance(a, tl.tensor) else np.asarray(a) for a in args]
            if scalar == tl.bfloat16:
                values = [_bf16_as_fp32(v) if isinstance(a, tl.tensor) and _is_bf16(a.handle) else v
                          for a, v in zip(args, values)]
            with np.errstate(all="ignore"):   # (inf, NaN as a GPU gives them, no numpy warning)
                out = function(*values)
            out = _fp32_as_bf16(out.astype(np.float32)) if scalar == tl.bfloat16 else \
                out.astype(like.handle.data.dtype)
            return tl.tensor(interpreter.TensorHandle(out, scalar), like.type)
        call.__name__, call.__module__ = name, libdevice.__name__   # (as the stub it stands in for)
        return call

    for table in (LIBDEVICE_UNARY, LIBDEVICE_BINARY):
        for name, numpy_name in table.items():
            if hasattr(libdevice, name):
                replace(libdevice, name, numpy_call(name, getattr(np, numpy_name)))


def device_aggregate(cls):
    """Triton's ``aggregate`` of ``cls``; under the interpreter, with the jit methods it drops put back."""
    made = _aggregate(cls)
    if os.environ.get("TRITON_INTERPRET", "0") != "1":   # (read as kernels/device.py reads it)
        return made
    for name, member in vars(cls).items():
        function = member.__func__ if isinstance(member, staticmethod) else member
        if type(function).__name__ != "InterpretedFunction" or name in vars(made):
            continue
        if isinstance(member, staticmethod):
            setattr(made, name, staticmethod(function))
        else:   # an InterpretedFunction is no descriptor: bind self by hand
            setattr(made, name, (lambda f: lambda self, *args, **kwargs: f(self, *args, **kwargs))(function))
    # Compiled, a constructor's arguments arrive wrapped (a Python bool becomes a constexpr) before the class's own
    # __init__ stores them; the interpreter passes them bare, and a constexpr field then refuses a plain value
    # (Iris's Tracing(enabled=False, ...)). Wrap them as the compiler would. A tensor field likewise gets a tensor
    # where the interpreter has a Python number (a loop's index is one there, a tensor compiled: tritonBLAS's Tile).
    kinds = {n: kind for n, kind in made.__annotations__.items() if kind in (tl.constexpr, tl.tensor)}
    if kinds:
        checked_setattr = made.__setattr__

        def __setattr__(self, name, value):
            kind = kinds.get(name)
            if kind is tl.constexpr and not isinstance(value, tl.constexpr):
                value = tl.constexpr(value)
            elif kind is tl.tensor and isinstance(value, (int, float)) and not isinstance(value, bool):
                from triton.runtime import interpreter

                semantic = getattr(interpreter, "interpreter_semantic", None)
                value = semantic.to_tensor(value) if semantic is not None else value
            checked_setattr(self, name, value)

        made.__setattr__ = __setattr__
    return made


def _aggregates_keep_their_methods(replace):
    """Under the interpreter every aggregate made inside the scope keeps its jit methods (:func:`device_aggregate`):
    Iris's and tritonBLAS's classes (``Context``, ``Tile``, ``GemmContext``...) are made with
    ``triton.language.core._aggregate`` when their modules are imported, which a hosted program does inside it."""
    import triton.language.core as language_core

    if os.environ.get("TRITON_INTERPRET", "0") == "1" and language_core._aggregate is _aggregate:
        replace(language_core, "_aggregate", device_aggregate)


# -- the one owner of the interpreter's patches --------------------------------------------------------------
# Every patch gemmar makes to Triton's interpreter, in the order they are applied: each wraps what the ones above
# it left (the sanitizer's create_atomic_rmw, on the builder instance, calls the atomics' one, on its class, which
# calls Triton's). (name, why, apply); apply(replace) calls replace(owner, attribute, value). A slot whose apply
# is None is filled by the layer named in its reason, through subscribe(): this module imports none of them.
SUBSCRIBED = None
PATCHES = (
    ("index of one-element arrays", "Triton 3.6: int() of a program id failed under NumPy 2.4",
     _index_of_one_element_arrays),
    ("language patched once per launch", "the interpreter patched triton.language again at every helper call",
     _patch_once_per_launch),
    ("overflow checks that cannot fire skipped", "their assert needs debug, which the interpreter never sets",
     _skip_overflow_checks_that_cannot_fire),
    ("bf16 arithmetic and atomics on every dtype", "bf16 ran on its bits; some atomics refused or not atomic",
     _patch_bf16_and_atomics),
    ("casts to bf16 round to nearest even", "the interpreter took low bits or truncated", _patch_casts_to_bf16),
    ("aggregates keep their jit methods", "Triton's aggregate drops them under the interpreter",
     _aggregates_keep_their_methods),
    ("libdevice's math runs", "its functions are stubs under the interpreter: libdevice.fast_expf gave None",
     _libdevice_math),
    ("false tl.assume warns", "a hosted program's GPU hint must not stop its run (the program layer subscribes)",
     SUBSCRIBED),
    ("interpreted launches return a handle", "a hosted program reads a launch's result (the program layer "
     "subscribes)", SUBSCRIBED),
    ("heap accesses recorded", "the sanitizer numbers every load, store, atomic and kernel call (it subscribes "
     "when a rank starts recording); last, so it records what the patches above did", SUBSCRIBED),
)
_subscribed = {}        # slot name -> the apply a layer subscribed with
_applied = []           # (name, [(owner, attribute, had_own, old)]) while the scope is entered, in applied order
_depth = 0              # scopes entered and not yet left (nested, or in several threads)
_lock = threading.RLock()


def subscribe(name, apply):
    """Fill the slot ``name`` of :data:`PATCHES` with ``apply`` (``apply(replace)``), for this process. Again with
    the same name: the later apply replaces the earlier. Inside the scope it takes effect at once."""
    slots = [n for n, _, a in PATCHES if a is SUBSCRIBED]
    if name not in slots:
        raise UsageError(f"interpreter patch slot {name!r} does not exist; slots: {', '.join(map(repr, slots))}")
    with _lock:
        before = _subscribed.get(name)
        _subscribed[name] = apply
        if _depth:   # (between kernel launches: re-applied in the declared order)
            _restore()
            try:
                _apply()
            except BaseException:   # (a broken layer: the patches as they were, and the error, not a poisoned process)
                if before is None:
                    del _subscribed[name]
                else:
                    _subscribed[name] = before
                _apply()
                raise


def applied():
    """The names of the patches in place now, in the order they were applied (empty outside the scope; a patch
    this release does not need replaced nothing and is not named)."""
    return [name for name, undo in _applied if undo]


@contextlib.contextmanager
def gemmar_interpreter():
    """``with gemmar_interpreter():`` - Triton's interpreter with gemmar's patches (:data:`PATCHES`, in order)
    inside; on leaving the outermost one, Triton's interpreter exactly as it was. Process-wide (the interpreter is
    one per process) and re-entrant. gemmar enters it around every kernel it runs on cpu ranks and around a hosted
    program; a participant's own kernel launched outside runs on Triton's own interpreter."""
    global _depth
    with _lock:
        if _depth == 0:
            _apply()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore()


def _apply():
    for name, _, apply in PATCHES:
        apply = _subscribed.get(name) if apply is SUBSCRIBED else apply
        if apply is None:
            continue
        undo = []

        def replace(owner, attribute, value, undo=undo):
            own = vars(owner)
            undo.append((owner, attribute, attribute in own, own.get(attribute)))
            setattr(owner, attribute, value)

        _applied.append((name, undo))
        try:
            apply(replace)
        except BaseException:
            _restore()
            raise


def _restore():
    while _applied:
        _, undo = _applied.pop()
        while undo:
            owner, attribute, had_own, old = undo.pop()
            if had_own:
                setattr(owner, attribute, old)
            else:
                delattr(owner, attribute)


check_release(triton.__version__)
