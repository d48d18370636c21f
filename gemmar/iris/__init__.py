"""gemmar's Iris layer: what makes a program written for AMD's Iris run unchanged on gemmar's ranks, through the
kit's program hook (``hook.py``, registered in pyproject.toml; the kit itself never imports this folder).

- ``hook.py``: on every rank ``import iris`` gives an Iris: a real Iris checkout hosted over the rank's heap
  (``real_iris.py``: gemmar supplies Iris's ``SymmetricHeap``, ``iris.host.platform.hip`` and what else Iris asks
  of the machine), an installed Iris, or gemmar's stand-in, laid out as Iris lays out its package:
- the stand-in, each module naming the Iris module it stands in for: ``host.py`` (``iris``: ``iris.iris()`` and
  the host API), ``tensors.py`` (``iris.tensor_creation``), ``device.py`` (``iris.device``, ``iris.mem``:
  ``DeviceContext``, the device API, timers), ``tiles.py`` (Iris's tile API), ``hip.py`` (``iris.hip``),
  ``ccl.py`` (``iris.ccl``) and ``ops.py`` (``iris.ops``), both run by gemmar's kernels, ``tracing.py``
  (``iris.host.tracing``), ``log_format.py`` (``iris.host.logging``), ``this_rank.py`` (the rank's heap).

Running the program itself (``gemmar run``, ``Cluster.run_script``, ``%%px``) is the kit's: ``gemmar/programs/``.
"""
