"""The registry of fused GEMM + all-reduce algorithms: name -> :class:`~gemmar.kernels.spec.AlgorithmSpec`.

The built-in ones are listed here and nowhere else; a user's own is added with :func:`register_algorithm` (or by
passing its spec as ``algorithm=`` to ``Cluster.gemm_all_reduce`` / ``bench``, which registers it).

The kernels (and with them torch and Triton) are imported on first use of the registry, not with this module:
the command line lists the built-in names and refuses a bad flag without waiting for them (issue 61).
"""

from .errors import UsageError

BUILTIN_NAMES = ("atomics", "ring", "two_shot", "one_shot")   # the specs' names, in BUILTIN's order
_registry = {}


def _builtin():
    """The built-in specs, registered on first use."""
    from .kernels import atomics, one_shot, ring, two_shot

    builtin = (atomics.SPEC, ring.SPEC, two_shot.SPEC, one_shot.SPEC)
    if not _registry:
        _registry.update({spec.name: spec for spec in builtin})
    return builtin


def names():
    """Every registered algorithm's name, the built-in ones first."""
    _builtin()
    return tuple(_registry)


def builtin_names():
    return BUILTIN_NAMES


def register_algorithm(spec):
    """Add (or replace) a user's algorithm; returns its name. A built-in one cannot be replaced."""
    from .kernels.spec import AlgorithmSpec

    _builtin()
    if not isinstance(spec, AlgorithmSpec):
        raise UsageError(f"register() takes an AlgorithmSpec, got {type(spec).__name__}")
    known = _registry.get(spec.name)
    if known is not None and known.builtin and known is not spec:
        raise UsageError(f"algorithm name {spec.name!r} is taken by a built-in algorithm: give yours another name")
    _registry[spec.name] = spec
    return spec.name


def get(algorithm):
    """The spec of ``algorithm`` (a registered name, or a spec, which is registered first)."""
    from .kernels.spec import AlgorithmSpec

    _builtin()
    if isinstance(algorithm, AlgorithmSpec):
        register_algorithm(algorithm)
        return algorithm
    spec = _registry.get(algorithm) if isinstance(algorithm, str) else None
    if spec is None:
        raise UsageError(f"algorithm {algorithm!r} is not known: use one of {', '.join(_registry)} (or register "
                         f"your own AlgorithmSpec)")
    return spec
