"""Everything @triton.jit, one idea per module: the Iris-style device API (device), the trace schema (events),
the persistent GEMM (gemm), the three all-reduce kernels (atomics, ring, two_shot) and the barrier."""
