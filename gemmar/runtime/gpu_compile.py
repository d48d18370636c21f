"""Would it compile for a GPU? A configuration's kernels, with a participant's parts in them, compiled for
an NVIDIA Hopper GPU (sm_90) on this machine, which needs no GPU (Triton compiles for any target).

The interpreter runs what the compiler may refuse (Python's own functions and objects, host calls, a
value's type changing in a loop), so a puzzle that is right on CPU ranks is also compiled before it is
called right. The kernels' arguments are described, not allocated: tensors on torch's ``meta`` device,
built by the algorithm's own ``buffers`` and ``launches``.
"""

import types
import warnings

import torch

from ..kernels.device import WATCHDOG_WORDS
from ..kernels.spec import LaunchContext
from .launch import gemm_constexprs

TARGET = ("cuda", 90, 32)   # Hopper (sm_90): backend, compute capability, warp size
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
                 torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8"}


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def _launches(config, parts):
    """The algorithm's launches for rank 0 of ``config``, on meta tensors, with ``parts`` in them."""
    spec, W = config.spec, config.world_size
    k_r = -(-config.k // W)
    A, B = _meta((config.m, k_r), config.torch_dtype), _meta((k_r, config.n), config.torch_dtype)
    heap = types.SimpleNamespace(rank=0, world_size=W, heap_bases=_meta((W,), torch.int64))
    gemm = gemm_constexprs(config, k_r, trace_capacity=0, tma=False)
    ctx = LaunchContext(config=config, heap=heap, buffers=spec.buffers(_meta, config, W), A=A, B=B, K=k_r,
                        strides=dict(stride_am=k_r, stride_ak=1, stride_bk=config.n, stride_bn=1), gemm=gemm,
                        trace=_meta((1,), torch.int64), trace_counts=_meta((config.programs,), torch.int64),
                        parts=spec.parts_for(parts), watchdog=_meta((WATCHDOG_WORDS,), torch.int64),
                        gpu=True)
    return spec.launches(ctx)


def _signature(kernel, kwargs):
    signature, constexprs = {}, {}
    for param in kernel.params:
        name = param.name
        value = kwargs.get(name, param.default if param.has_default else None)
        if param.is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name], constexprs[name] = "constexpr", value
    return signature, constexprs


def compile_error(config, parts):
    """None when ``config``'s kernels, with ``parts``, compile for sm_90; else one line saying why not.
    (Also None when this Triton cannot compile for NVIDIA here at all: there is nothing to learn.)"""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for launch in _launches(config, parts):
        signature, constexprs = _signature(launch.kernel, launch.kwargs)
        try:
            with warnings.catch_warnings():   # (Triton 3.9 warns about a default of its own: not the participant's)
                warnings.simplefilter("ignore", UserWarning)
                triton.compile(ASTSource(fn=launch.kernel, signature=signature, constexprs=constexprs),
                               target=GPUTarget(*TARGET))
        except Exception as e:  # noqa: BLE001 - Triton's errors have no common base; the message is what counts
            if "ptxas" in str(e) and ("not found" in str(e) or "No such file" in str(e)):
                return None
            return _one_line(e)
    return None


def _one_line(error):
    """Triton's compile error -> "in <function>, line <n>: <what>", from the innermost error of the chain
    (the outer ones point at the call of the part inside the package's kernel)."""
    while error.__cause__ is not None:
        error = error.__cause__
    message = getattr(error, "error_message", None) or ""
    if not message:
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip() not in ("", "^")]
        message = lines[-1] if lines else type(error).__name__
    src, node = getattr(error, "src", None), getattr(error, "node", None)
    where = ""
    if isinstance(src, str) and src.lstrip().startswith("def ") and getattr(node, "lineno", None):
        name = src.lstrip()[4:].split("(")[0]
        where = f"in {name}, line {node.lineno} of the function: "
    return f"{where}{message}"
