"""gemmar's patches to Triton's interpreter hold only where gemmar runs kernels (issue 59 item 2).

One module owns them (gemmar/kernels/triton_support.py: ``PATCHES``, in a declared order, and the
``gemmar_interpreter()`` scope); the sanitizer subscribes to its slot. A participant's own ``@triton.jit``
kernel launched outside gemmar's launches runs on Triton's interpreter as Triton ships it, and leaving the
scope, by an exception too, gives Triton's interpreter back exactly as it was.
"""

import os
import sys

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from gemmar.kernels.triton_support import PATCHES, applied, gemmar_interpreter
from gemmar.sanitizer import record


def double(x, out):
    value = tl.load(x)
    tl.store(out, value + value)


def add_one(counter):
    tl.atomic_add(counter, 1.0)


@pytest.fixture
def interpreted(monkeypatch):
    """``triton.jit`` of a plain function, under the interpreter (the test process may not interpret)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return triton.jit


def doubled_one(kernel):
    x, out = torch.ones(1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.bfloat16)
    kernel[(1,)](x, out)
    return out.item()


def tritons_own(function):
    return function.__module__ == "triton.runtime.interpreter"


def test_a_plain_kernel_outside_gemmar_runs_on_tritons_own_interpreter(interpreted):
    kernel = interpreted(double)
    # Triton's interpreter adds bf16 values as their 16-bit integers: 0x3F80 + 0x3F80 = 0x7F00, 1.7e38, not 2.0.
    assert doubled_one(kernel) == pytest.approx(1.7014118e38)
    assert tritons_own(vars(interpreter.InterpreterBuilder)["binary_op"]) and tritons_own(interpreter._patch_lang)
    with gemmar_interpreter():
        assert doubled_one(kernel) == 2.0
        assert not tritons_own(vars(interpreter.InterpreterBuilder)["binary_op"])
    assert doubled_one(kernel) == pytest.approx(1.7014118e38)
    assert tritons_own(vars(interpreter.InterpreterBuilder)["binary_op"]) and tritons_own(interpreter._patch_lang)


def atomic_calls(kernel):
    """(file, function) of each call on the way of one tl.atomic_add, outermost first."""
    calls = []

    def profile(frame, event, arg):
        name = frame.f_code.co_name
        if event == "call" and name in ("atomic_rmw", "create_atomic_rmw"):
            calls.append((os.path.basename(frame.f_code.co_filename), name))

    counter = torch.zeros(1)
    sys.setprofile(profile)
    try:
        kernel[(1,)](counter)
    finally:
        sys.setprofile(None)
    assert counter.item() == 1.0
    return calls


def test_the_patches_apply_in_the_declared_order(interpreted):
    kernel = interpreted(add_one)
    record.install()   # (the sanitizer's slot, as a rank that starts recording fills it)
    with gemmar_interpreter():
        names = applied()
        through = atomic_calls(kernel)
    # Each patch wraps what the ones before it left: the sanitizer's (last, on the builder instance) calls the
    # atomics' (on the builder's class), which calls Triton's.
    assert through == [("record.py", "atomic_rmw"), ("triton_support.py", "create_atomic_rmw"),
                       ("interpreter.py", "create_atomic_rmw")]
    declared = [name for name, _, _ in PATCHES]
    assert names == sorted(names, key=declared.index) and names[-1] == "heap accesses recorded"
    assert {"bf16 arithmetic and atomics on every dtype", "language patched once per launch"} <= set(names)
    assert atomic_calls(kernel) == [("interpreter.py", "create_atomic_rmw")]   # outside: Triton's alone
    assert applied() == []


LAUNCH_STATE = {"grid_dim", "grid_idx"}   # (the builder's, set by every launch, patched or not)


def everything_the_patches_reach():
    """Every attribute of the objects gemmar's patches replace attributes of: name -> the object itself."""
    owners = (interpreter, interpreter.InterpreterBuilder, interpreter.GridExecutor, interpreter.InterpretedFunction,
              interpreter.interpreter_builder, interpreter.interpreter_semantic, tl.core)
    return [{k: v for k, v in vars(owner).items() if k not in LAUNCH_STATE} for owner in owners]


def test_leaving_the_scope_by_an_exception_gives_triton_back_as_it_was(interpreted):
    kernel = interpreted(double)
    record.install()
    before = everything_the_patches_reach()
    with pytest.raises(TypeError):
        with gemmar_interpreter():
            with pytest.raises(TypeError):
                with gemmar_interpreter():   # nested: leaving it keeps the outer scope's patches
                    kernel[(1,)](torch.ones(1))   # (out is missing: Triton's launch raises)
            assert doubled_one(kernel) == 2.0 and applied()
            patched = everything_the_patches_reach()
            raise TypeError("a participant's error inside the scope")
    after = everything_the_patches_reach()
    assert any(p.keys() != b.keys() or any(p[k] is not b[k] for k in b) for p, b in zip(patched, before))
    for old, new in zip(before, after):
        assert old.keys() == new.keys()
        assert [k for k in old if new[k] is not old[k]] == []
    assert doubled_one(kernel) == pytest.approx(1.7014118e38) and applied() == []


def test_a_layer_whose_patch_fails_leaves_the_patches_as_they_were():
    """A subscriber whose apply raises inside the scope: the error reaches its caller, the patches in place stay
    as they were, and later scopes are not poisoned by it."""
    from gemmar.kernels.triton_support import subscribe

    def broken(replace):
        raise RuntimeError("a broken layer")

    slot = next(name for name, _, apply in PATCHES if apply is None and name != "heap accesses recorded")
    with gemmar_interpreter():
        before = applied()
        with pytest.raises(RuntimeError, match="a broken layer"):
            subscribe(slot, broken)
        assert applied() == before
    with gemmar_interpreter():
        assert applied() == before


def library_math(x, out, N: tl.constexpr):
    from triton.language.extra import libdevice

    offsets = tl.arange(0, N)
    value = tl.load(x + offsets)
    tl.store(out + offsets, libdevice.fast_expf(value) + libdevice.sqrt(value) + libdevice.pow(value, 2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_libdevice_math_runs_in_gemmar_and_is_a_stub_outside(interpreted, dtype):
    # (Iris's flash decode calls libdevice.fast_expf: a stub under Triton's interpreter, which gave None)
    kernel = interpreted(library_math)
    x = torch.linspace(0.25, 4.0, 16).to(dtype)
    out = torch.zeros(16, dtype=dtype)
    with gemmar_interpreter():
        kernel[(1,)](x, out, 16)
    reference = (x.float().exp() + x.float().sqrt() + x.float() ** 2).to(dtype)
    torch.testing.assert_close(out, reference, rtol=2e-2 if dtype == torch.bfloat16 else 1e-6, atol=0)
    with pytest.raises(Exception, match="NoneType"):
        kernel[(1,)](x, out, 16)


def library_math_of_a_number(out):
    from triton.language.extra import libdevice

    tl.store(out, libdevice.exp(1.0))


def test_libdevice_math_of_python_numbers_is_an_fp32_scalar(interpreted):
    kernel, out = interpreted(library_math_of_a_number), torch.zeros(1)
    with gemmar_interpreter():
        kernel[(1,)](out)
    assert out.item() == pytest.approx(2.718281828, rel=1e-6)


def test_libdevice_is_left_alone_where_kernels_compile(monkeypatch):
    # (a hosted program on a GPU enters the scope too: its compiled kernels need libdevice's own functions)
    from triton.language.extra import libdevice

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    stub = libdevice.fast_expf
    with gemmar_interpreter():
        assert libdevice.fast_expf is stub
