"""Which Triton releases gemmar accepts, the work-arounds accepted releases need, and a faster interpreter.

Imported by ``gemmar.kernels`` before any kernel is defined, so both take effect wherever a kernel can run
(the client, every engine, a notebook).

Triton 3.6's interpreter turns a scalar into a Python int with ``int(array)``, and its scalars (e.g.
``tl.program_id``) are one-element 1-D numpy arrays. NumPy 2.4 refuses ``int()`` of an array that is not
0-D, so under 3.6 with a current NumPy every ``range(pid, ...)`` in a kernel failed with "only 0-dimensional
arrays can be converted to Python scalars". Triton 3.7 squeezes the array first; :func:`_patch_interpreter`
does the same for 3.6. Compiled kernels never reach this code.

Two costs of the interpreter are cut: the language is patched once per launch, not at every call of a
``@triton.jit`` helper (:func:`_patch_once_per_launch`), and integer-overflow checks whose assert cannot fire
are skipped (:func:`_skip_overflow_checks_that_cannot_fire`).

Two gaps of the interpreter (every accepted release) are filled by :func:`_patch_bf16_and_atomics`:

- **bf16 arithmetic**: the interpreter keeps bf16 values as their uint16 bits and runs ``+``, ``*``, ``<`` ... on
  those integers (``1.0 + 1.0`` gave ``2**127``). A bf16 operation is computed in fp32 here and rounded back to
  bf16 (round to nearest even), as a GPU does.
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
"""

import os

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


def _patch_interpreter():
    """Triton 3.6 only: make the interpreter's ``__index__`` accept one-element arrays (see the module doc)."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_squeezing(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_tensor_squeezing


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


def _patch_once_per_launch():
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

    patch_lang = interpreter._patch_lang
    seen_langs = weakref.WeakKeyDictionary()   # function -> (its globals' size, the language modules among them)
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

    interpreter._patch_lang = patch_lang_once_per_launch


def _skip_overflow_checks_that_cannot_fire():
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

    semantic.binary_op_sanitize_overflow_impl = overflow_check_when_it_can_fire


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


def _patch_bf16_and_atomics():
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

    builder.binary_op, builder.unary_op, builder.create_fma = bf16_binary_op, bf16_unary_op, create_fma
    builder.create_atomic_rmw = create_atomic_rmw
    # (the class's create_fadd etc. are lambdas that look binary_op up on the instance, so they take this one)


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


def _patch_casts_to_bf16():
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
    builder.cast_impl = cast_rounding_to_nearest_even


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


def _aggregates_keep_their_methods():
    """Under the interpreter every aggregate made from now on keeps its jit methods (:func:`device_aggregate`):
    Iris's and tritonBLAS's classes (``Context``, ``Tile``, ``GemmContext``...) are made with
    ``triton.language.core._aggregate`` when their modules are imported, after gemmar's."""
    import triton.language.core as language_core

    if os.environ.get("TRITON_INTERPRET", "0") == "1" and language_core._aggregate is _aggregate:
        language_core._aggregate = device_aggregate


check_release(triton.__version__)
if release(triton.__version__) == (3, 6):
    _patch_interpreter()
_patch_once_per_launch()
_skip_overflow_checks_that_cannot_fire()
_patch_bf16_and_atomics()
_patch_casts_to_bf16()
_aggregates_keep_their_methods()
