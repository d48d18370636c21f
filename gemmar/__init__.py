"""gemmar: learn, trace and debug fused GEMM + all-reduce kernels written in Triton.

    import gemmar
    with gemmar.Cluster(world_size=3) as cluster:       # ipyparallel engines = ranks
        result = cluster.gemm_all_reduce(A, B, algorithm="ring", block=(32, 32, 16), iterations=5)
        result.C                                         # checked against torch on every rank

The kernels and the device API (Iris-style) live in ``gemmar.kernels``; how ranks run them in
``gemmar.runtime``; traces and figures in ``gemmar.analysis``.
"""

from .cluster import Cluster, Result
from .config import RunConfig, k_bounds
from .errors import ClusterError, DeadlockError, GemmarError, RankDiedError, UsageError
from .analysis.trace import Trace

__version__ = "0.1.0"

__all__ = ["Cluster", "Result", "RunConfig", "k_bounds", "GemmarError", "UsageError", "DeadlockError",
           "RankDiedError", "ClusterError", "Trace", "__version__"]
