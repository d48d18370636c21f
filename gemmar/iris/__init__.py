"""Iris programs on gemmar's ranks: everything that makes ``gemmar run``, ``Cluster.run_script`` and ``%%px``
run a program written for AMD's Iris, unchanged.

- ``runner.py``: the client side (``Cluster.run_script``, ``Cluster.activate``): start the program on every
  rank, stream its output tagged by rank, say how each rank ended.
- ``rank.py``: the rank side: gemmar's ``iris`` package in place of Iris, CUDA host calls on the cpu backend,
  the program run as ``__main__``; ``launch.py``: the program's own launch (``mp.spawn``, torchrun,
  ``torch.distributed``) pointed at gemmar's ranks.
- the ``iris`` package a program imports: ``host.py`` (``import iris``: ``iris.iris()`` and the host API),
  ``device.py`` (``DeviceContext``, ``iris.device.utils``), ``hip.py``, ``ccl.py`` and ``ops.py``
  (collectives and fused GEMM + all-reduce run by gemmar's kernels), ``tracing.py`` (``shmem.tracing``: device
  events recorded, exported for Perfetto and ``gemmar gantt``).
"""
