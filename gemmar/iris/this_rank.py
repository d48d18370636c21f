"""The rank an Iris program runs on: its heap, set by ``rank.py`` before the program starts."""

from ..errors import UsageError

heap = None


def rank_heap():
    if heap is None:
        raise UsageError("iris.iris() works on gemmar's ranks only: run the program with `gemmar run -r N "
                         "script.py`, Cluster.run_script, or in a %%px cell after Cluster.activate()")
    return heap
