"""Ops that build their GEMM on tritonBLAS, imported at import as Iris's ops do."""

from tritonblas.kernels.stages import GemmContext


def matmul(a, b):
    return GemmContext(a, b)
