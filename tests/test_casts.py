"""Casts to bf16 and fp16 on cpu ranks give a compiled kernel's bits (issue 58 item 5).

Triton's interpreter (3.6-3.9) turned an integer into bf16 by taking its low 16 bits as bf16 bits (an
``atomic_add`` of 1 into bf16 added 9.18e-41) and truncated fp32 to bf16; gemmar/kernels/triton_support.py
rounds to nearest even, as compiled kernels do. Checked on real ranks (engine processes running the
interpreter) against torch's ``.to()``, which rounds as a compiled kernel does (benchmarks/cast_bits.py
compares a compiled kernel with torch on a GPU): explicit ``.to()`` and a store's implicit cast, from fp32,
fp16, int32, int64 and fp64, over values that need rounding (ties, negatives, subnormals, inf, NaN, large
integers).
"""

import contextlib

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from gemmar.kernels import device
from gemmar.runtime.heap import barrier_all
from gemmar.runtime.rank import local_ranks


@triton.jit
def cast_kernel(x, out, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out + offsets, tl.load(x + offsets).to(out.dtype.element_ty))


@triton.jit
def store_kernel(x, out, N: tl.constexpr):   # the store casts to out's dtype
    offsets = tl.arange(0, N)
    tl.store(out + offsets, tl.load(x + offsets))


@triton.jit
def add_integer_ones(counter, rank, heap_bases):
    device.atomic_add(counter, 1, rank, 0, heap_bases, sem="acq_rel", scope="sys")   # into rank 0's counter
    tl.atomic_add(counter + 1, 1)                                                   # into this rank's own


def casts_on_ranks(sources):
    """On each rank this engine hosts: every source cast to bf16 and fp16 by ``.to()`` and by a store, and
    the integer 1 added into a bf16 counter of rank 0's heap and into one of each rank's own by 3 programs."""
    outs = []
    for ctx in local_ranks():
        heap = ctx.heap
        casts = {}
        for name, x in sources.items():
            n = triton.next_power_of_2(x.numel())
            padded = torch.zeros(n, dtype=x.dtype, device=heap.device)
            padded[:x.numel()] = x.to(heap.device)
            for dst in (torch.bfloat16, torch.float16):
                for how, kernel in (("to", cast_kernel), ("store", store_kernel)):
                    out = torch.zeros(n, dtype=dst, device=heap.device)
                    with heap.on_stream():
                        kernel[(1,)](padded, out, n)
                    heap.synchronize()
                    casts[name, dst, how] = out[:x.numel()].cpu()
        outs.append(casts)
    heaps = [ctx.heap for ctx in local_ranks()]
    with contextlib.ExitStack() as scopes:
        for heap in heaps:
            scopes.enter_context(heap.scope())
        counters = [heap.zeros(2, torch.bfloat16) for heap in heaps]
        barrier_all(heaps)
        for heap, counter in zip(heaps, counters):
            with heap.on_stream():
                add_integer_ones[(3,)](counter, heap.rank, heap.heap_bases)
        barrier_all(heaps)
        for out, counter in zip(outs, counters):
            out["counter"] = counter.float().cpu().tolist()
        barrier_all(heaps)
    return outs


def fp32_values():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2 ** 32, 2048, dtype=np.uint64).astype(np.uint32)
    ties = (np.arange(1, 129, dtype=np.uint32) << 16) | np.uint32(0x8000)   # halfway between two bf16s
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38,
                        1e-45, -1e-45, 1.17549435e-38, 1e-40, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 65504.0, 65520.0, 1e-8],
                       np.float32)
    return torch.from_numpy(np.concatenate([random_bits.view(np.float32), ties.view(np.float32),
                                            -ties.view(np.float32), special]))


def integer_values(dtype):
    big = [2 ** 24 + 1, 2 ** 24 + 3, 2 ** 31 - 1, -2 ** 31, 3 * (2 ** 24 + 1), 65519, 65520, -65521]
    if dtype == torch.int64:
        big += [2 ** 53 + 1, 2 ** 62 + 2 ** 40 + 1, -2 ** 63, 2 ** 63 - 1]
    return torch.tensor(list(range(-300, 301)) + big, dtype=dtype)


def fp64_near_ties(dst):
    """fp64 values just off the midpoint of two neighbours in ``dst``, so close that rounding to fp32 first lands
    on the midpoint, with the neighbour that rounding once gives (a compiled kernel's fptrunc rounds once;
    torch's ``.to()`` goes through fp32)."""
    rng = np.random.default_rng(1)
    low = torch.from_numpy(rng.integers(0x0400, 0x7B00, 256, dtype=np.int64).astype(np.int16)).view(dst)
    high = (low.view(torch.int16) + 1).view(dst)
    middle = (low.double() + high.double()) / 2
    above = torch.arange(256) % 2 == 0
    x = middle + middle.abs() * 2.0 ** -40 * torch.where(above, 1.0, -1.0).double()
    return torch.cat([x, -x]), torch.cat([torch.where(above, high, low), -torch.where(above, high, low)])


def same_bits(got, want):
    """Where ``got`` has ``want``'s bits (any NaN for a NaN: bf16 NaNs differ in their payload between GPUs)."""
    nan = torch.isnan(want.float())
    return ((got.view(torch.int16) == want.view(torch.int16)) & ~nan) | (torch.isnan(got.float()) & nan)


@pytest.mark.parametrize("world_size", [2])
def test_casts_to_bf16_and_fp16_on_ranks_give_torchs_bits(clusters, world_size):
    f32 = fp32_values()
    sources = {"fp32": f32, "fp16": f32.to(torch.float16), "int32": integer_values(torch.int32),
               "int64": integer_values(torch.int64), "fp64": f32.double(),
               "fp64 near bf16 ties": fp64_near_ties(torch.bfloat16)[0],
               "fp64 near fp16 ties": fp64_near_ties(torch.float16)[0]}
    outs = clusters(world_size).run_ranks(casts_on_ranks, sources)
    assert len(outs) == world_size
    for rank, casts in enumerate(outs):
        checked = 0
        for key, got in casts.items():
            if key == "counter":
                continue
            name, dst, how = key
            x = sources[name]
            if name.startswith("fp64 near"):
                if name != f"fp64 near {'bf16' if dst == torch.bfloat16 else 'fp16'} ties":
                    continue
                want = fp64_near_ties(dst)[1]   # rounded once, as a compiled kernel's fptrunc does (torch: twice)
            else:
                want = x.to(dst)
            wrong = ~same_bits(got, want)
            assert not wrong.any(), (f"rank {rank}: {name} -> {dst} by {how}: {int(wrong.sum())} of {x.numel()} "
                                     f"differ, e.g. {x[wrong][:4].tolist()} gave {got[wrong][:4].tolist()}, not "
                                     f"{want[wrong][:4].tolist()}")
            checked += 1
        assert checked == 2 * 2 * 5 + 2 * 2
        # The integer 1 adds 1.0 into bf16 (it added 9.18e-41): every rank's 3 programs into rank 0's counter,
        # and each rank's 3 into its own.
        assert casts["counter"] == [3.0 * world_size if rank == 0 else 0.0, 3.0], casts["counter"]


def bf16_dot(a, b, c, N: tl.constexpr):
    rows, cols = tl.arange(0, N)[:, None], tl.arange(0, N)[None, :]
    product = tl.dot(tl.load(a + rows * N + cols), tl.load(b + rows * N + cols))
    tl.store(c + rows * N + cols, product)


def test_a_bf16_dot_on_cpu_ranks_multiplies_values_not_their_bits(monkeypatch):
    """Triton's interpreter keeps bf16 as uint16 bits and gave tl.dot those bits as integers (C ~ 7e10 for values
    near 1: every bf16 case of Iris's tests/ops, examples/iris_real/bf16_matmul.py). Small integers are exact in
    bf16 and their products' sums in fp32, so C must equal torch's product exactly."""
    from gemmar.kernels.triton_support import gemmar_interpreter

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = triton.jit(bf16_dot)
    generator = torch.Generator().manual_seed(5)
    a, b = (torch.randint(-4, 5, (16, 16), generator=generator).to(torch.bfloat16) for _ in range(2))
    c = torch.zeros(16, 16, dtype=torch.float32)
    with gemmar_interpreter():
        kernel[(1,)](a, b, c, N=16)
    assert torch.equal(c, a.float() @ b.float())
