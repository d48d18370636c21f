"""gemmar: learn, trace and debug fused GEMM + all-reduce kernels written in Triton.

    import gemmar
    with gemmar.Cluster(world_size=3) as cluster:       # ipyparallel engines = ranks
        result = cluster.gemm_all_reduce(A, B, BLK_M=32, BLK_N=32, BLK_K=16, iterations=5)
        result.C                                         # checked against torch on every rank

The kernels and the device API (Iris-style) live in ``gemmar.kernels``, each algorithm's spec beside its
kernels and the registry in ``gemmar.algorithms``; how ranks run them in ``gemmar.runtime``; traces and
figures in ``gemmar.analysis``. A user's own algorithm is an ``AlgorithmSpec`` (``gemmar/kernels/spec.py``).

The names below are imported on first use: ``import gemmar`` itself is instant (torch and Triton load
when a Cluster, a RunConfig or a Trace is first touched), so a Ctrl-C during the command's start is caught.
"""

import importlib

from .errors import ClusterError, DeadlockError, GemmarError, HeapBoundsError, RankDiedError, UsageError

__version__ = "0.1.0"

_LAZY = {"Cluster": ".cluster", "Result": ".cluster", "RunConfig": ".config", "k_bounds": ".config",
         "Trace": ".analysis.trace", "register_algorithm": ".algorithms",
         **{name: ".kernels.spec" for name in ("AlgorithmSpec", "Phase", "Done", "Launch", "Part")}}

__all__ = ["Cluster", "Result", "RunConfig", "k_bounds", "GemmarError", "UsageError", "DeadlockError",
           "RankDiedError", "ClusterError", "HeapBoundsError", "Trace", "AlgorithmSpec", "Phase", "Done", "Launch", "Part",
           "register_algorithm", "__version__"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gemmar' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
