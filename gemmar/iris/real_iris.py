"""The real Iris package hosted on gemmar's ranks: Iris's own host class, device functions, tiles, ``ccl`` and
``ops`` kernels run unchanged; gemmar supplies only what Iris asks of the machine.

Iris (``iris/host/iris.py``) builds its ``SymmetricHeap`` from a torch or vmem allocator whose peers' memory it
maps through dma-buf handles of ROCm's (or CUDA's) runtime library, which ``iris/host/platform/hip.py`` loads at
import. Device code only ever sees ``heap_bases`` (one address per rank, as this process maps them) and pointers
into its own heap, and gemmar's heaps are exactly that. So on a rank gemmar puts in place:

- ``iris.host.platform.hip``: the device queries (``count_devices``, ``set_device``, ``get_cu_count``, ...)
  answered for the rank's device; the driver calls of Iris's own allocators (dma-buf, vmem) are refused in one
  line when called, since gemmar's heap is already mapped into every rank;
- Iris's ``SymmetricHeap``: :class:`HeapOverGemmar`, the rank's gemmar heap (cpu: shared memory under the
  interpreter; cuda: torch symmetric memory or CUDA IPC) with Iris's methods (``allocate``, ``get_heap_bases``,
  ``is_symmetric``, ``as_symmetric`` by copy, as Iris's torch allocator does);
- ``tritonblas`` (a git-only dependency that ``iris.ops`` imports at import) only where none is installed:
  a stand-in whose every name says in one line, when Iris's ops use it, that tritonBLAS is missing.

Processes, ``torch.distributed`` (Iris calls ``dist.barrier`` and ``all_gather`` itself), streams and CUDA host
calls on cpu ranks are the same as for every program ``gemmar run`` runs (``launch.py``, ``host_calls.py``).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

from ..errors import UsageError
from . import this_rank

# Iris's device-side memory API (iris.load/store/atomic_*, DeviceContext, tiles): a bounds or rank report names the
# line of the kernel that called it, as for gemmar's stand-in; Iris's own kernels (ccl, ops) are named themselves.
DEVICE_API_PACKAGES = ("iris.mem.", "iris.device.")
STAND_IN = "gemmar"   # the iris a rank runs when asked for gemmar's own (``--replace_iris``)


def checkout_root(path):
    """The folder to put on ``sys.path`` for the Iris at ``path`` (a checkout, or its ``iris`` package folder);
    a path that holds no Iris is refused in one line."""
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    for root in (path, os.path.dirname(path)):
        if os.path.isfile(os.path.join(root, "iris", "host", "iris.py")):
            return root
    raise UsageError(f"--iris {path}: no Iris package there (looked for iris/host/iris.py in it and above it): "
                     f"give a checkout of ROCm/iris, or leave --iris out for the installed one")


def installed_root():
    """Where an installed (pip, ``pip install -e``) Iris package lives, or None; gemmar's own stand-in is not one."""
    try:
        spec = importlib.util.find_spec("iris")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        return None
    package = os.path.dirname(spec.origin)
    if not os.path.isfile(os.path.join(package, "host", "iris.py")):
        return None
    return os.path.dirname(package)


def choose(iris=None, replace_iris=False):
    """Which Iris a program runs on: ``"gemmar"`` (the stand-in) or a folder holding a real Iris package.
    ``iris``: a path to a checkout; else an installed Iris when there is one; else the stand-in."""
    if iris is not None and replace_iris:
        raise UsageError("--iris and --replace_iris ask for two different Iris: give one of them")
    if replace_iris:
        return STAND_IN
    if iris is not None:
        return checkout_root(iris)
    root = installed_root()
    if root is None:
        refuse_installed_iris()   # (a module named iris that is not Iris's package: never hidden unasked)
    return root or STAND_IN


def describe(choice):
    if choice == STAND_IN:
        return "gemmar's Iris stand-in (gemmar/iris: Iris's API over gemmar's kernels; --iris PATH runs a real Iris)"
    return f"the real Iris from {os.path.join(choice, 'iris')} (its own kernels, on gemmar's heaps)"


def installed_iris():
    """Where an Iris other than gemmar's module is installed or imported in this process, or None."""
    stand_in = sys.modules.get("gemmar.iris.host")
    if stand_in is not None and sys.modules.get("iris") is stand_in:
        return None
    try:
        spec = importlib.util.find_spec("iris")
    except ValueError:   # an `iris` already imported without a spec
        return getattr(sys.modules.get("iris"), "__file__", None) or "imported"
    return spec.origin if spec is not None else None


def refuse_installed_iris():
    where = installed_iris()
    if where is not None:
        raise UsageError(f"an installed Iris was found ({where}) that gemmar cannot host (no iris/host/iris.py): "
                         f"gemmar will not put its own iris module in its place unless asked: add --replace_iris "
                         f"(replace_iris=True), give a checkout with --iris PATH, or run the program with mpirun")


# -- what gemmar supplies ------------------------------------------------------------------------------------
class _Refused:
    """A driver call of Iris's own allocators: present (Iris imports it by name), refused in one line if called."""

    def __init__(self, module, name, why):
        self.__name__, self._where, self._why = name, f"{module}.{name}", why

    def __call__(self, *args, **kwargs):
        raise UsageError(f"{self._where}: {self._why}")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Refused(self._where, name, self._why)


def _machine_module(name):
    """``iris.host.platform.hip`` on gemmar's ranks."""
    from . import hip as machine_queries   # (torch: imported on a rank, not by `gemmar run --help`)

    module = types.ModuleType(name, "gemmar's answers to Iris's device queries (gemmar/iris/real_iris.py)")
    for query in ("get_num_xcc", "get_wall_clock_rate", "get_cu_count", "count_devices", "get_device_id"):
        setattr(module, query, getattr(machine_queries, query))
    module.set_device = _set_device
    module.get_arch_string = lambda device_id=None: _arch()
    module.get_rocm_version = lambda: (-1, -1)   # (what Iris answers where no ROCm is installed)
    module._is_amd_backend = False
    why = ("a GPU driver call of Iris's own allocators; on gemmar's ranks the symmetric heap is gemmar's, already "
           "mapped into every rank, so Iris does not need it")

    def refused(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Refused(name, attr, why)

    module.__getattr__ = refused
    return module


def _set_device(gpu_id):
    import torch

    device = this_rank.rank_heap().arena.device
    if device.type == "cuda":
        torch.cuda.set_device(device)   # (the rank's GPU, whatever id Iris computed from its rank)


def _arch():
    import torch

    device = this_rank.rank_heap().arena.device
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


class _Absent(types.ModuleType):
    """``tritonblas`` where it is not installed: every name is a placeholder that refuses when used."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Refused(self.__name__, attr, "tritonBLAS is not installed, and Iris's ops (iris.ops) build their GEMM "
                                             "on it: install it from its git repository (Iris's pyproject.toml names "
                                             "the branch), or use iris.ccl without iris.ops")


class _Supplier(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules gemmar supplies to a real Iris (see the module's docstring)."""

    def __init__(self, tritonblas_missing):
        self.tritonblas_missing = tritonblas_missing

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "iris.host.platform.hip":
            return importlib.machinery.ModuleSpec(fullname, self)
        if self.tritonblas_missing and (fullname == "tritonblas" or fullname.startswith("tritonblas.")):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name == "iris.host.platform.hip":
            return _machine_module(spec.name)
        module = _Absent(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def forget_iris_modules():
    """Whichever iris this engine ran last (the stand-in, or another checkout) leaves sys.modules."""
    for name in list(sys.modules):
        if name == "iris" or name.startswith("iris.") or isinstance(sys.modules[name], _Absent):
            del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Supplier)]


def host(root):
    """Import the real Iris from ``root`` on this rank, with gemmar's heap and machine in place. Returns it."""
    forget_iris_modules()
    if root not in sys.path:
        sys.path.insert(0, root)
    importlib.invalidate_caches()
    missing = importlib.util.find_spec("tritonblas") is None
    sys.meta_path.insert(0, _Supplier(missing))
    try:
        iris = importlib.import_module("iris")
        symmetric_heap = importlib.import_module("iris.host.memory.symmetric_heap")
        host_module = importlib.import_module("iris.host.iris")
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever stopped Iris's import, said in one line
        where = getattr(e, "filename", None) or ""
        raise UsageError(f"the Iris at {root} could not be imported on this rank: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}{f' ({where})' if where else ''}") from None
    if not hasattr(host_module, "SymmetricHeap"):
        raise UsageError(f"the Iris at {root} has no iris.host.iris.SymmetricHeap: gemmar hosts Iris's layout of "
                         f"2026 (iris/host/iris.py builds a SymmetricHeap); run it with --replace_iris instead")
    symmetric_heap.SymmetricHeap = host_module.SymmetricHeap = HeapOverGemmar
    from ..kernels.device import DEVICE_API_MODULE   # (here: the CLI reads this module before it imports Triton)

    for name, module in list(sys.modules.items()):   # (Iris's device API: reports name the line calling it)
        if name.startswith(DEVICE_API_PACKAGES) and module is not None:
            setattr(module, DEVICE_API_MODULE, True)
    if this_rank.rank_heap().arena.device.type == "cpu":
        _accept_the_cpu_as_cuda(importlib.import_module("iris.host.memory.tensors"))
    return iris


def _accept_the_cpu_as_cuda(tensor_creation):
    """On cpu ranks the heap's device is the CPU, and "cuda" means it (``host_calls.cuda_on_cpu``); Iris's device
    check accepts CUDA devices only, so here it also accepts the CPU that stands for one."""
    import torch

    iris_check = tensor_creation.is_valid_device

    def is_valid_device(device, iris_device):
        if device is not None and iris_device.type == "cpu" and torch.device(device).type in ("cpu", "cuda"):
            return True
        return iris_check(device, iris_device)

    tensor_creation.is_valid_device = is_valid_device


class _NoAllocator:
    """``heap.allocator``: Iris closes it when its ``Iris`` object goes; gemmar's heap outlives the program."""

    def close(self):
        pass


class HeapOverGemmar:
    """Iris's ``SymmetricHeap`` (iris/host/memory/symmetric_heap.py) over this rank's gemmar heap.

    Like gemmar's stand-in, each new Iris object hands the heap out afresh from its end (re-running a setup cell
    reuses the memory); allocations are symmetric because every rank allocates the same sequence, as in Iris."""

    def __init__(self, heap_size, device_id, cur_rank, num_ranks, allocator_type="torch"):
        heap = this_rank.rank_heap()
        if (cur_rank, num_ranks) != (heap.rank, heap.world_size):
            raise UsageError(f"Iris's heap for rank {cur_rank} of {num_ranks}: this is gemmar's rank {heap.rank} of "
                             f"{heap.world_size} (its torch.distributed group must be gemmar's)")
        allocator_type = os.environ.get("IRIS_ALLOCATOR", allocator_type).lower()
        if allocator_type not in ("torch", "vmem"):
            raise UsageError(f"allocator_type={allocator_type!r}: Iris has 'torch' and 'vmem'")
        if allocator_type == "vmem":
            raise UsageError("allocator_type='vmem': Iris's vmem allocator maps memory through ROCm's virtual memory "
                             "API; on gemmar's ranks the heap is a fixed arena: use allocator_type='torch'")
        self.heap = heap
        self.heap_size, self.device_id, self.cur_rank, self.num_ranks = heap_size, device_id, cur_rank, num_ranks
        self.allocator = _NoAllocator()
        self.fd_conns = None
        if heap_size > heap.size and cur_rank == 0:
            print(f"[gemmar] iris.iris(heap_size={heap_size}): each rank's heap is {heap.size} bytes "
                  f"(gemmar run --heap_size); allocations past that are refused", file=sys.stderr, flush=True)
        self.heap_bases = heap.heap_bases
        # The ranks meet first (as Iris's constructor does), then each hands its heap out afresh: no rank reuses the
        # memory while a peer still works on the tensors of the last Iris object (Iris's would be a new heap).
        self.refresh_peer_access()
        heap.release_program_memory()

    def allocate(self, num_elements, dtype, alignment=1024):
        self.refresh_peer_access()   # (collective, as in Iris: see refresh_peer_access)
        with self.heap.allocating_for_program():
            return self.heap.empty(max(int(num_elements), 0), dtype, alignment=alignment)

    def get_device(self):
        return self.heap.arena.device

    def get_heap_bases(self):
        return self.heap_bases

    def on_symmetric_heap(self, tensor):
        if tensor.numel() == 0:
            return True
        start = self.heap.arena.data_ptr()
        return start <= tensor.data_ptr() < start + self.heap.size

    is_symmetric = on_symmetric_heap

    def refresh_peer_access(self):
        """Every rank's arena is mapped into every rank from the start, so nothing is mapped here; but the ranks
        meet, as in Iris (its refresh starts with ``dist.barrier()`` and gathers the bases): an allocation is
        collective, and a program where only some ranks allocate waits here as it would on Iris (issue #464)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()

    def close_fd_conns(self):
        pass

    def as_symmetric(self, external_tensor):
        """Iris's torch allocator: a copy on the heap (not the same memory)."""
        if not external_tensor.is_contiguous():
            raise UsageError("as_symmetric(): only contiguous tensors can be imported; call .contiguous() first")
        copy = self.allocate(external_tensor.numel(), external_tensor.dtype).view(external_tensor.shape)
        return copy.copy_(external_tensor)
