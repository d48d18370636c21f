"""The registry of fused GEMM + all-reduce algorithms: name -> :class:`~gemmar.kernels.spec.AlgorithmSpec`.

The built-in ones are listed here and nowhere else; a user's own is added with :func:`register_algorithm` (or by
passing its spec as ``algorithm=`` to ``Cluster.gemm_all_reduce`` / ``bench``, which registers it).
"""

from .errors import UsageError
from .kernels import atomics, ring, two_shot
from .kernels.spec import AlgorithmSpec

BUILTIN = (atomics.SPEC, ring.SPEC, two_shot.SPEC, two_shot.ONE_SHOT_SPEC)
_registry = {spec.name: spec for spec in BUILTIN}


def names():
    """Every registered algorithm's name, the built-in ones first."""
    return tuple(_registry)


def builtin_names():
    return tuple(spec.name for spec in BUILTIN)


def register_algorithm(spec):
    """Add (or replace) a user's algorithm; returns its name. A built-in one cannot be replaced."""
    if not isinstance(spec, AlgorithmSpec):
        raise UsageError(f"register() takes an AlgorithmSpec, got {type(spec).__name__}")
    known = _registry.get(spec.name)
    if known is not None and known.builtin and known is not spec:
        raise UsageError(f"algorithm name {spec.name!r} is taken by a built-in algorithm: give yours another name")
    _registry[spec.name] = spec
    return spec.name


def get(algorithm):
    """The spec of ``algorithm`` (a registered name, or a spec, which is registered first)."""
    if isinstance(algorithm, AlgorithmSpec):
        register_algorithm(algorithm)
        return algorithm
    spec = _registry.get(algorithm) if isinstance(algorithm, str) else None
    if spec is None:
        raise UsageError(f"algorithm {algorithm!r} is not known: use one of {', '.join(_registry)} (or register "
                         f"your own AlgorithmSpec)")
    return spec
