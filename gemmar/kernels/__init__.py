"""The Triton kernels, one idea per module: gemm (persistent GEMM), atomics, ring, barrier."""
