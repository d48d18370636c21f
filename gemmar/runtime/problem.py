"""The problem a run solves and how right its answer must be: the seeded global inputs, each rank's K-slice,
the reference C and the tolerance. The same on every engine that builds them."""

import torch

from ..config import k_bounds


def seeded_problem(config, device):
    """The global A (M x K) and B (K x N) that ``config.seed`` stands for (the same on every rank), the
    reference C and the inputs' ``input_scale``: built once per engine, however many ranks it hosts.

    On a GPU the reference and the scale are fp32 products there (tf32 off): fast, and far more precise than
    the tolerance; on cpu the reference is fp64."""
    gen = torch.Generator().manual_seed(config.seed)
    A = torch.randn(config.m, config.k, generator=gen).to(config.torch_dtype)
    B = torch.randn(config.k, config.n, generator=gen).to(config.torch_dtype)
    if device.type == "cuda":
        A_full, B_full = A.to(device, torch.float32), B.to(device, torch.float32)
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        reference, scale = A_full @ B_full, input_scale(A_full, B_full)
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        del A_full, B_full
    else:
        reference, scale = A.double() @ B.double(), input_scale(A, B)
    return A, B, reference, scale


def rank_slice(A, B, config, rank, device):
    """Rank ``rank``'s K-slice of the global A and B, on ``device``."""
    start, end = k_bounds(config.k, config.world_size, rank)
    return A[:, start:end].contiguous().to(device), B[start:end, :].contiguous().to(device)


# Back-to-back checked launches multiply their inputs by these in turn, in the same tensors, so that each
# launch's right answer differs from the last one's: a launch that did not run, or read an earlier launch's
# partials, leaves a wrong result. Powers of two: the scaled result is exactly the result scaled. The last
# launch of a run multiplies by 1 (its result is the one returned).
CHECK_SCALES = (1.0, -0.5, -1.0, 0.5)


def scale_inputs(tensors, bases, iteration, iterations, heaps):
    """Before launch ``iteration`` of ``iterations``: each tensor set, in place, to its base (``bases``, one
    per tensor; None: nothing scaled) times this launch's CHECK_SCALES factor, which it returns. On a GPU the
    ranks' streams then wait for the copies."""
    if bases is None:
        return 1.0
    factor = CHECK_SCALES[(iterations - 1 - iteration) % len(CHECK_SCALES)]
    for tensor, base in zip(tensors, bases):
        tensor.copy_(base * factor)
    if tensors and tensors[0].device.type == "cuda":   # (copied on the default stream)
        for heap in heaps:
            for stream in (heap.stream, heap.side_stream):
                stream.wait_stream(torch.cuda.current_stream(tensors[0].device))
    return factor


EPSILON = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 0.0}


def tolerance(config, scale=1.0, peak=None, c_dtype=None, wire_dtype=None, interpreted=False):
    """Allowed max |C - reference|, for inputs whose products |a| |b| average ``scale`` and a reference
    whose largest |value| is ``peak``.

    fp32 accumulation error grows with K (fp32 inputs use ieee dots); rounding C to its dtype costs half
    an ulp of C; rounding each rank's partial to the wire dtype (an algorithm whose partials travel in a
    dtype of their own) costs that again per rank. Scaling by the inputs' magnitude keeps a correct result
    with large inputs from being rejected. ``c_dtype`` and ``wire_dtype`` default to the config's.

    ``interpreted``: the kernel ran under the Triton interpreter, whose fp32 arithmetic is numpy's IEEE fp32.
    Then no correct kernel, whatever order it sums in, errs by more than :func:`fp32_sum_bound`, which at
    workshop sizes is far tighter than the GPU allowance above (notebook 7: 9e-4 against 0.0095, where the
    right kernel errs by 2e-6 and one that rounds the partials it pulls to fp16 by 0.0087, which passed).
    """
    base = (1e-3 * max(1.0, config.k ** 0.5) + 1e-4 * config.world_size) * max(scale, 1e-30)
    if interpreted:
        base = min(base, fp32_sum_bound(config, scale))
    rounding = rounding_error(c_dtype or config.c_dtype)
    wire_dtype = wire_dtype or (config.wire_torch_dtype if config.spec.wire_dtype else None)
    if wire_dtype is not None:
        rounding += config.world_size * rounding_error(wire_dtype)
    return base + rounding * (peak if peak is not None else 0.0)


# How far above the worst case of a correct fp32 kernel the interpreter's tolerance sits (so that the approximate
# fp32 ``scale`` never makes the bound too tight); rounding any value to fp16 on the way costs 10x more at
# notebook sizes.
FP32_BOUND_MARGIN = 2.0


def fp32_sum_bound(config, scale):
    """FP32_BOUND_MARGIN x the largest error any order of fp32 additions can make summing an element of C: K
    products and W partials, (K + W + 1) u sum_k |a||b| with u = 2^-24 (fp16 and bf16 products are exact in
    fp32, an fp32 product rounds once), where sum_k |a||b| <= K x ``scale`` (``input_scale``)."""
    k, world_size = config.k, config.world_size
    return FP32_BOUND_MARGIN * (k + world_size + 1) * 2.0 ** -24 * k * max(scale, 1e-30)


NARROWER = {"fp16": torch.float16, "bf16": torch.bfloat16}
SIGNIFICANT_BITS = {"fp16": 11, "bf16": 8}


def rounded_to(error, peak):
    """"fp16" or "bf16" when ``error`` (max |C - reference|), relative to C's largest |value| ``peak``, is the
    size that rounding values to that dtype on their way into C makes; else None. Rounding a value v costs up
    to u |v| (u: EPSILON), so over the many elements of C the largest error of a few roundings is u/8 to 3u of
    ``peak``: fp16 below bf16's u/8 (bf16's roundings err by more), bf16 from there to 4u."""
    if not peak or not error or error != error:
        return None
    relative = error / peak
    fp16, bf16 = EPSILON[torch.float16], EPSILON[torch.bfloat16]
    return ("fp16" if fp16 / 16 <= relative < bf16 / 8 else "bf16" if bf16 / 8 <= relative <= 4 * bf16 else None)


def narrower_dtype_hint(error, peak):
    """For a C that missed its tolerance: what :func:`rounded_to` suggests, as the end of its line; else ""."""
    name = rounded_to(error, peak)
    if name is None:
        return ""
    return (f": about what rounding to {name} costs ({error / peak:.2g} of C's largest value; {name} keeps "
            f"{SIGNIFICANT_BITS[name]} significant bits): was a partial or a sum rounded to {name} on its way "
            f"into C? Keep them in fp32")


def rounding_error(dtype):
    """The largest relative error of converting an fp32 value to ``dtype``: half an ulp, since the conversion
    rounds to nearest even, in compiled kernels and under the Triton interpreter alike (whose own conversion to
    bf16 truncated, a whole ulp, until gemmar/kernels/triton_support.py rounded it)."""
    return EPSILON[dtype]


def input_scale(A, B):
    """The largest mean |a| |b| over K of any element of C: sum_k |a_ik| |b_kj| / K, at most. About 0.64 for
    unit normals; it grows with the inputs' magnitude, and so does the tolerance."""
    if A.numel() == 0 or B.numel() == 0:
        return 1.0
    return float((A.abs().float() @ B.abs().float()).max()) / A.shape[1]
