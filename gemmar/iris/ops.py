"""``iris.ops`` on gemmar: Iris's fused GEMM + collective ops, ``shmem.ops.matmul_all_reduce(out, A, B)`` first.

``matmul_all_reduce`` runs one of gemmar's fused kernels (``FusedGemmAllReduce``, the launcher every gemmar run
uses): each rank's ``A`` (M x K_r) and ``B`` (K_r x N) are its K-slice, and every rank ends with
``out = sum over ranks of A_r @ B_r``. ``FusedConfig.all_reduce_variant`` picks the kernel: ``two_shot``
(Iris's default; gemmar's two-shot by tile owner: the same bits on every rank, run after run), ``atomic``
(gemmar's atomics), ``ring`` (gemmar's ring), ``one_shot`` (gemmar's one_shot: every rank sums every tile);
``spinlock`` runs two_shot, said once. Tiles
and programs are gemmar's tuned defaults for the device unless the program passes a ``FusedConfig``, whose
block sizes and ``num_sms`` are then used. Back-to-back calls with the same shapes reuse one launcher: no
reset between them (its flags count launches).

The other fused ops of Iris (``all_gather_matmul``, ``matmul_all_gather``, ``matmul_reduce_scatter``) are
not fused here: they run gemmar's collective then ``torch.matmul`` (or the reverse), said once; their
results are what Iris's give.

Iris's module-level calls take the ``iris.iris()`` first: ``ops.matmul_all_reduce(shmem, out, A, B, config=)``,
``ops.matmul_reduce_scatter(...)``, and their ``*_preamble(shmem, out, A, B, config=)``, which return a
:class:`Workspace`: gemmar's launchers keep their own flags, so a workspace only remembers how many tiles it was
made for, and a call with more tiles is refused as Iris refuses an undersized lock array. ``iris.ops.config`` and
``iris.ops.matmul_reduce_scatter`` are this module too (``FusedConfig``, ``matmul_reduce_scatter``).
"""

from dataclasses import dataclass

import torch

from ..errors import UsageError
from .ccl import Workspace

VARIANT_ALGORITHM = {"two_shot": "two_shot", "atomic": "atomics", "ring": "ring", "one_shot": "one_shot",
                     "spinlock": "two_shot"}


@dataclass
class FusedConfig:
    """Iris's ``iris.ops.FusedConfig``: gemmar reads the block sizes, ``group_size_m``, ``num_sms`` and
    ``all_reduce_variant``; the others are accepted and not used."""

    block_size_m: int = 256
    block_size_n: int = 64
    block_size_k: int = 64
    group_size_m: int = 1
    num_sms: int = None
    num_xcds: int = 1
    chunk_size: int = 1
    cache_modifier_a: str = ".ca"
    cache_modifier_b: str = ".ca"
    allow_tf32: bool = True
    all_reduce_variant: str = "two_shot"
    all_reduce_num_rings: int = 1

    def validate(self, world_size=None):
        if self.all_reduce_variant not in VARIANT_ALGORITHM:
            raise UsageError(f"all_reduce_variant={self.all_reduce_variant!r} is not known: use one of "
                             f"{', '.join(VARIANT_ALGORITHM)}")
        return True


def _tiles(shmem, A, B, config):
    """How many output tiles a call has: with ``config``'s block sizes, else gemmar's tuned ones."""
    if config is not None:
        bm, bn = config.block_size_m, config.block_size_n
    else:
        settings = shmem.ops._settings(A, B, None)
        bm, bn = settings["BLK_M"], settings["BLK_N"]
    return -(-A.shape[0] // bm) * -(-B.shape[1] // bn)


def _preamble(what, shmem, A, B, config, workspace):
    """A :class:`Workspace` for these shapes; an existing ``workspace`` is checked and given back."""
    tiles = _tiles(shmem, A, B, config)
    if workspace is not None:
        workspace.check(what, tiles)
        return workspace
    return Workspace(tiles)


def matmul_all_reduce_preamble(shmem, output_tensor, A, B, config=None, workspace=None):
    return _preamble("matmul_all_reduce", shmem, A, B, config, workspace)


def matmul_all_reduce(shmem, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
    """Iris's module-level ``ops.matmul_all_reduce(shmem, out, A, B)``: ``shmem.ops.matmul_all_reduce``."""
    return shmem.ops.matmul_all_reduce(output_tensor, A, B, bias, async_op, config, workspace)


def matmul_reduce_scatter_preamble(shmem, output_tensor, A, B, config=None, workspace=None):
    return _preamble("matmul_reduce_scatter", shmem, A, B, config or FusedConfig(), workspace)


def matmul_reduce_scatter(shmem, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
    """Iris's module-level ``ops.matmul_reduce_scatter(shmem, out, A, B)``: ``shmem.ops.matmul_reduce_scatter``."""
    return shmem.ops.matmul_reduce_scatter(output_tensor, A, B, bias, async_op, config, workspace)


@dataclass
class GatherWorkspace:
    """What ``all_gather_matmul_hbm_buffer_preamble`` returns: ``aux_buffer``, the gathered A (M x K, on the heap);
    ``locks``: empty, since gemmar's all-gather ends with a barrier and needs no per-tile flags."""

    aux_buffer: torch.Tensor
    locks: torch.Tensor
    trace_data: object = None
    prepared: bool = True


def all_gather_matmul_hbm_buffer_preamble(shmem, A_sharded, B, config=None, workspace=None, **unused):
    M, k_r = A_sharded.shape
    if workspace is not None and tuple(workspace.aux_buffer.shape) == (M, k_r * shmem.num_ranks):
        return workspace
    return GatherWorkspace(shmem.zeros((shmem.num_ranks * M, k_r), dtype=A_sharded.dtype),
                           torch.zeros(0, dtype=torch.int32, device=A_sharded.device))


def all_gather_matmul_hbm_buffer(shmem, output_tensor, A_sharded, B, bias=None, config=None, workspace=None,
                                 trace=False, **unused):
    """Iris's all-gather + GEMM through a staging buffer in HBM: here ``all_gather_matmul`` (not fused) through
    the workspace's buffer; returns the workspace (made when none is given)."""
    workspace = all_gather_matmul_hbm_buffer_preamble(shmem, A_sharded, B, config, workspace)
    shmem.ops.all_gather_matmul(output_tensor, A_sharded, B, bias, config=config, workspace=workspace)
    return workspace


# Iris's tuning table and heuristic for its MI300X hbm-buffer kernel: gemmar has neither (its kernel is not that
# one); the names exist so that code importing them loads, and a call says so.
_CHAMPION_CONFIGS = {}


def _auto_config(M, N, K, world_size, **unused):
    raise UsageError("ops._auto_config is the launch heuristic of Iris's MI300X hbm-buffer kernel; gemmar does not "
                     "run that kernel: pass a FusedConfig")


def _with_bias(product, bias):
    """``product`` plus Iris's bias: one value per row (M, as Iris's ops take it), or per column (N, as torch)."""
    if bias is None:
        return product
    if bias.dim() == 1 and bias.numel() == product.shape[0]:
        return product + bias[:, None]
    if bias.dim() == 1 and bias.numel() == product.shape[1]:
        return product + bias
    raise UsageError(f"bias of shape {tuple(bias.shape)}: use one value per row ({product.shape[0]}) or per column "
                     f"({product.shape[1]}) of the {tuple(product.shape)} output")


class FusedOps:
    """``shmem.ops``: the fused ops of one ``iris.iris()`` (its launchers, by shape)."""

    def __init__(self, shmem):
        self._shmem = shmem
        self._launchers = {}   # settings -> FusedGemmAllReduce, reused call after call


    def _settings(self, A, B, config):
        """RunConfig settings for this rank's A (M x K_r) and B (K_r x N)."""
        from ..config import dtype_name
        from ..tuning import reads_by_tma, tuned_defaults

        shmem = self._shmem
        heap, W = shmem._heap, shmem.num_ranks
        M, k_r, N = A.shape[0], A.shape[1], B.shape[1]
        algorithm = VARIANT_ALGORITHM[(config or FusedConfig()).all_reduce_variant]
        given = {}
        if config is not None:
            given = dict(BLK_M=config.block_size_m, BLK_N=config.block_size_n, BLK_K=config.block_size_k,
                         gsize_m=config.group_size_m, num_sms=config.num_sms)
        device = heap.device
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            knobs = tuned_defaults("cuda", algorithm, (props.major, props.minor),
                                   props.multi_processor_count // heap.ranks_on_device, (M, N, k_r, W), given,
                                   tma=reads_by_tma(N, k_r * W, W, dtype_name(A.dtype)),
                                   shared=heap.ranks_on_device > 1)
        else:
            knobs = tuned_defaults("cpu", algorithm, given=given)
        return dict(knobs, m=M, n=N, k=k_r * W, datatype=dtype_name(A.dtype), algorithm=algorithm, world_size=W,
                    timeout_s=heap.timeout_s)

    def matmul_all_reduce(self, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = sum over ranks of A @ B`` on every rank, by one of gemmar's fused kernels."""
        from ..config import RunConfig
        from ..runtime.launch import FusedGemmAllReduce

        shmem = self._shmem
        if config is not None:
            config.validate(shmem.num_ranks)
        if bias is not None:
            raise UsageError("ops.matmul_all_reduce(bias=...): gemmar's fused kernels add no bias: add it to the "
                             "output afterwards")
        if async_op:
            raise UsageError("ops.matmul_all_reduce(async_op=True): gemmar's op returns when done: use "
                             "async_op=False")
        for name, t in (("output", output_tensor), ("A", A), ("B", B)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise UsageError(f"ops.matmul_all_reduce: {name} must be a 2-D torch tensor, got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
        if A.shape[1] != B.shape[0] or tuple(output_tensor.shape) != (A.shape[0], B.shape[1]):
            raise UsageError(f"ops.matmul_all_reduce: A is {tuple(A.shape)}, B {tuple(B.shape)} and output "
                             f"{tuple(output_tensor.shape)}; need A: M x K, B: K x N, output: M x N")
        if A.dtype != B.dtype:
            raise UsageError(f"ops.matmul_all_reduce: A is {A.dtype} and B {B.dtype}: use one dtype")
        settings = self._settings(A, B, config)
        if workspace is not None:
            workspace.check("matmul_all_reduce", _tiles(shmem, A, B, config))
        key = tuple(sorted(settings.items()))
        if key not in self._launchers:
            run = RunConfig.from_settings(settings)
            heap = shmem._heap
            with heap.allocating_for_program():
                self._launchers[key] = FusedGemmAllReduce(heap, run)
            shmem.barrier()   # every rank's new flags are zeroed before any peer signals into them
            shmem.info_once(f"ops.matmul_all_reduce: gemmar's {run.algorithm} kernel, {run.BLK_M} x {run.BLK_N} x "
                            f"{run.BLK_K} tiles, {run.programs} programs per rank")
            requested = (config or FusedConfig()).all_reduce_variant
            if requested == "spinlock":
                shmem.info_once(f"ops.matmul_all_reduce: variant {requested!r} runs gemmar's {run.algorithm}")
        C = self._launchers[key](A.contiguous(), B.contiguous())
        output_tensor.copy_(C)
        return output_tensor

    # -- not fused here: a collective, then torch.matmul (or the reverse) ----------------------------
    def all_gather_matmul(self, output_tensor, A_sharded, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = all_gather(A_sharded along K) @ B`` (Iris: A's columns are split between the ranks)."""
        self._shmem.info_once("ops.all_gather_matmul: not fused in gemmar: ccl.all_gather, then torch.matmul")
        shmem = self._shmem
        M, k_r = A_sharded.shape
        gathered = workspace.aux_buffer if isinstance(workspace, GatherWorkspace) else \
            shmem.zeros((shmem.num_ranks * M, k_r), dtype=A_sharded.dtype)
        shmem.ccl.all_gather(gathered, A_sharded.contiguous())
        A = gathered.view(shmem.num_ranks, M, k_r).permute(1, 0, 2).reshape(M, shmem.num_ranks * k_r)
        output_tensor.copy_(_with_bias(A @ B, bias))
        return output_tensor

    def matmul_all_gather(self, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = all_gather(A @ B along M)``: each rank's rows, every rank's result."""
        self._shmem.info_once("ops.matmul_all_gather: not fused in gemmar: torch.matmul, then ccl.all_gather")
        local = _with_bias(A @ B, bias).contiguous()
        self._shmem.ccl.all_gather(output_tensor, local)
        return output_tensor

    def matmul_reduce_scatter(self, output_tensor, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = reduce_scatter(A @ B)`` in Iris's tiles: ``config``'s ``block_size_m x block_size_n`` (Iris's
        FusedConfig defaults without one) dealt out ``tiles // W`` to a rank, the last rank the rest; each rank's
        output holds the sum over ranks on its own tiles."""
        from .ccl import reduce_scatter_tiles

        shmem = self._shmem
        shmem.info_once("ops.matmul_reduce_scatter: not fused in gemmar: torch.matmul, then a reduce-scatter")
        config = config or FusedConfig()
        if workspace is not None:
            workspace.check("matmul_reduce_scatter", _tiles(shmem, A, B, config))
        local = shmem.zeros(tuple(output_tensor.shape), dtype=output_tensor.dtype)
        local.copy_(_with_bias(A @ B, bias))
        reduce_scatter_tiles(shmem, output_tensor, local, config.block_size_m, config.block_size_n,
                             last_takes_rest=True)
        return output_tensor
