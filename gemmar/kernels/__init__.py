"""Everything @triton.jit, one idea per module: the Iris-style device API (device), the trace schema (events),
the persistent GEMM (gemm), the all-reduce kernels (atomics, ring, two_shot and one_shot) and the barrier.
``triton_support`` checks the installed Triton first, and owns the interpreter's patches, applied only inside
its ``gemmar_interpreter()`` scope."""

from . import triton_support  # noqa: F401  (before any kernel is defined)
