"""Casts to bf16 and fp16 in a Triton kernel, bit for bit against what a compiled kernel gives.

On a GPU the kernel is compiled (no gemmar needed there); without one it runs under Triton's interpreter with
gemmar's patches (gemmar/kernels/triton_support.py, "casts to bf16"). One line per cast: how many values give
torch's ``.to()`` bits (NaN: any NaN), in an explicit ``.to()`` and in a store's implicit cast; fp64 near
ties (values that fp32 would round onto a bf16 or fp16 tie) against rounding once, and against torch, which
rounds through fp32 (twice). And an ``atomic_add`` of the integer 1 into bf16, three programs.

    python benchmarks/cast_bits.py
"""

import os
import sys

import numpy as np
import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from gemmar.kernels.triton_support import gemmar_interpreter   # (the interpreter's patches, in their scope)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

DEVICE = "cuda" if GPU else "cpu"


@triton.jit
def cast_kernel(x, out, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out + offsets, tl.load(x + offsets).to(out.dtype.element_ty))


@triton.jit
def store_kernel(x, out, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out + offsets, tl.load(x + offsets))


@triton.jit
def add_one(counter):
    tl.atomic_add(counter, 1)


def fp32_values():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    ties = (np.arange(1, 256, dtype=np.uint32) << 16) | np.uint32(0x8000)   # halfway between two bf16s
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, 1e-45, 1.17549435e-38, 65504.0, 65520.0],
                       np.float32)
    return torch.from_numpy(np.concatenate([random_bits.view(np.float32), ties.view(np.float32),
                                            -ties.view(np.float32), special]))


def int_values(dtype):
    big = [2 ** 24 + 1, 2 ** 24 + 3, 2 ** 31 - 1, -2 ** 31, 3 * (2 ** 24 + 1), 65519, 65520]
    if dtype == torch.int64:
        big += [2 ** 53 + 1, 2 ** 62 + 2 ** 40 + 1, -2 ** 63, 2 ** 63 - 1]
    return torch.tensor(list(range(-300, 300)) + big, dtype=dtype)


def near_ties(dst):
    """fp64 values just off the midpoint of two neighbours in ``dst``, close enough that fp32 rounds them onto it,
    with the neighbour that rounding once gives."""
    rng = np.random.default_rng(1)
    low = torch.from_numpy(rng.integers(0x0400, 0x7B00, 512, dtype=np.int64).astype(np.int16)).view(dst)
    high = (low.view(torch.int16) + 1).view(dst)
    middle = (low.double() + high.double()) / 2
    offset = middle.abs() * 2.0 ** -40 * torch.where(torch.arange(512) % 2 == 0, 1.0, -1.0).double()
    return middle + offset, torch.where(offset > 0, high, low)


def run(kernel, x, dst):
    n = triton.next_power_of_2(x.numel())
    padded = torch.zeros(n, dtype=x.dtype, device=DEVICE)
    padded[:x.numel()] = x.to(DEVICE)
    out = torch.zeros(n, dtype=dst, device=DEVICE)
    kernel[(1,)](padded, out, n)
    return out[:x.numel()].cpu()


def same_bits(a, b):
    nan = torch.isnan(a.float()) & torch.isnan(b.float())
    return int(((a.view(torch.int16) == b.view(torch.int16)) | nan).sum())


def main():
    print(f"{'compiled on ' + torch.cuda.get_device_name() if GPU else 'Triton interpreter, gemmar patches'}; "
          f"Triton {triton.__version__}, torch {torch.__version__}")
    f32 = fp32_values()
    for x in (f32, f32.to(torch.float16), int_values(torch.int32), int_values(torch.int64), f32.double()):
        for dst in (torch.bfloat16, torch.float16):
            if x.dtype == dst:
                continue
            want = x.to(dst)
            counts = [same_bits(run(kernel, x, dst), want) for kernel in (cast_kernel, store_kernel)]
            print(f"{str(x.dtype):>14} -> {str(dst):<15} torch's bits: .to() {counts[0]}/{x.numel()}, "
                  f"store {counts[1]}/{x.numel()}")
    for dst in (torch.bfloat16, torch.float16):
        x, once = near_ties(dst)
        got = run(cast_kernel, x, dst)
        print(f"fp64 near ties -> {str(dst):<15} rounded once {same_bits(got, once)}/{x.numel()}, "
              f"as torch (through fp32) {same_bits(got, x.to(dst))}/{x.numel()}")
    nan_bits = run(cast_kernel, torch.tensor([float("nan")]), torch.bfloat16).view(torch.int16).item() & 0xFFFF
    print(f"fp32 NaN -> bf16 bits 0x{nan_bits:04X}")
    counter = torch.zeros(1, dtype=torch.bfloat16, device=DEVICE)
    add_one[(3,)](counter)
    print(f"atomic_add(bf16 counter, 1) by 3 programs: {counter.item()}")


if __name__ == "__main__":
    if GPU:
        main()
    else:
        with gemmar_interpreter():   # (gemmar patches Triton's interpreter only where it runs kernels)
            main()
